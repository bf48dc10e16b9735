"""The client library: Producer, Consumer, Admin."""

from fabric.client.admin import Admin
from fabric.client.batches import RecordFuture, RecordMetadata
from fabric.client.connection import DEFAULT_ENDPOINT
from fabric.client.consumer import Consumer, Message, ReceivedBatch
from fabric.client.producer import Producer

__all__ = [
    "DEFAULT_ENDPOINT",
    "Admin",
    "Consumer",
    "Message",
    "Producer",
    "ReceivedBatch",
    "RecordFuture",
    "RecordMetadata",
]
