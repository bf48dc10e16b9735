"""The client library: Producer, Consumer, Admin."""

from fabric.client.admin import Admin
from fabric.client.batches import Futures, RecordFuture, RecordMetadata
from fabric.client.consumer import Consumer, Message, ReceivedBatch
from fabric.client.leaders import LeaderProducer
from fabric.client.producer import Producer
from fabric.transport.connection import DEFAULT_ENDPOINT, use_credentials

__all__ = [
    "DEFAULT_ENDPOINT",
    "Admin",
    "Consumer",
    "Futures",
    "LeaderProducer",
    "Message",
    "Producer",
    "ReceivedBatch",
    "RecordFuture",
    "RecordMetadata",
    "use_credentials",
]
