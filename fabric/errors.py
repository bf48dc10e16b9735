"""One error tree, rooted in FabricError; every error carries its wire code.

A peer's bad input becomes an error *reply* carrying one of these codes; the
connection and the process live on. The client turns a reply's code back into
the same class with :func:`error_for_code`, so callers catch one tree whether the
error was raised locally or by the server.
"""

from __future__ import annotations


class FabricError(Exception):
    """Root of every error fabric raises on purpose."""

    code = 50
    name = "INTERNAL_ERROR"
    retriable = False

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message or self.name)
        self.message = message or self.name
        # extra reply params the error carries (e.g. NOT_COORDINATOR's "coordinator")
        self.details: dict[str, object] = details


class ProtocolError(FabricError):
    """Bytes that are not a valid frame, request or record batch."""

    code = 1
    name = "PROTOCOL_ERROR"


class UnsupportedVersion(ProtocolError):
    code = 2
    name = "UNSUPPORTED_VERSION"


class UnknownCommand(ProtocolError):
    code = 3
    name = "UNKNOWN_COMMAND"


class BadParameter(FabricError):
    code = 4
    name = "BAD_PARAMETER"


class UnknownQueue(FabricError):
    code = 5
    name = "UNKNOWN_QUEUE"


class QueueExists(FabricError):
    code = 6
    name = "QUEUE_EXISTS"


class MessageTooLarge(FabricError):
    code = 7
    name = "MESSAGE_TOO_LARGE"


class RequestTooLarge(ProtocolError):
    code = 8
    name = "REQUEST_TOO_LARGE"


class CorruptBatch(ProtocolError):
    """A record batch whose CRC32C, lengths or layout do not check out."""

    code = 9
    name = "CORRUPT_BATCH"


class QueueFull(FabricError):
    code = 10
    name = "QUEUE_FULL"
    retriable = True


class OffsetOutOfRange(FabricError):
    code = 11
    name = "OFFSET_OUT_OF_RANGE"


class StorageError(FabricError):
    code = 12
    name = "STORAGE_ERROR"


class UnknownPartition(FabricError):
    code = 13
    name = "UNKNOWN_PARTITION"


class NotLeader(FabricError):
    code = 14
    name = "NOT_LEADER"
    retriable = True


class Timeout(FabricError):
    code = 15
    name = "TIMEOUT"
    retriable = True


class UnknownSubscription(FabricError):
    code = 16
    name = "UNKNOWN_SUBSCRIPTION"


class DiskFull(StorageError):
    code = 19
    name = "DISK_FULL"
    retriable = True


class ShuttingDown(FabricError):
    code = 20
    name = "SHUTTING_DOWN"
    retriable = True


class OutOfOrderSequence(FabricError):
    """An idempotent producer's batch does not follow its last one: a gap (lost batch)."""

    code = 21
    name = "OUT_OF_ORDER_SEQUENCE"


class ProducerFenced(FabricError):
    """A newer epoch of this producer id exists: this (zombie) instance may not write."""

    code = 22
    name = "PRODUCER_FENCED"


class UnknownMember(FabricError):
    """The consumer-group member is not (or no longer) part of its group."""

    code = 23
    name = "UNKNOWN_MEMBER"
    retriable = True


class NotLeaseHolder(FabricError):
    """An ack, nack or visibility change for messages this member does not hold (its lease
    expired and the messages went to another member, or they were never delivered to it)."""

    code = 24
    name = "NOT_LEASE_HOLDER"


class KindMismatch(BadParameter):
    """A group joined with a subscription kind other than the one it already has."""

    code = 25
    name = "KIND_MISMATCH"


class ConfigError(FabricError):
    """A config file or option that does not validate; the message names the key."""

    code = 30
    name = "CONFIG_ERROR"


class ConnectionFailed(FabricError):
    """No reply from any endpoint in time (client side only)."""

    code = 31
    name = "CONNECTION_FAILED"
    retriable = True


class FencedLeaderEpoch(FabricError):
    """A request or replica carries a leader epoch older than the partition's: its sender
    (a deposed leader, or a client with an old map) must refresh before it may go on."""

    code = 33
    name = "FENCED_LEADER_EPOCH"
    retriable = True


class NotEnoughReplicas(FabricError):
    """acks=all and fewer in-sync replicas than the queue's min_insync_replicas: not written
    (or, when it says so, written but not to enough replicas)."""

    code = 34
    name = "NOT_ENOUGH_REPLICAS"
    retriable = True


class MetaUnavailable(FabricError):
    """The cluster's metadata store (etcd) cannot be reached or has no quorum; retry later."""

    code = 35
    name = "METADATA_UNAVAILABLE"
    retriable = True


class NotCoordinator(FabricError):
    """A consumer group's request reached a cluster node that does not coordinate the group: the
    reply's ``coordinator`` param names the endpoint of the node that does (null while none is
    elected); the client reconnects there."""

    code = 36
    name = "NOT_COORDINATOR"
    retriable = True


class NotDelivered(FabricError):
    """A direct (brokerless) queue's send found no consumer able to take it now: no consumer is
    registered, or the one it was for is gone or not keeping up. Direct queues are at most once:
    the message is dropped. Raised by the producer (no node is involved)."""

    code = 37
    name = "NOT_DELIVERED"


class NotAuthorized(FabricError):
    """Authentication is on and the request is not allowed: the client's key is unknown or
    revoked, or no ACL lets its principal do this operation on this resource. The message names
    the principal, the operation and the resource."""

    code = 38
    name = "NOT_AUTHORIZED"


class Throttled(FabricError):
    """A quota's debt is beyond what throttling can absorb (a client that did not wait out its
    ``throttle_ms``): refused before anything is written; ``retry_after_ms`` says when to retry."""

    code = 39
    name = "THROTTLED"
    retriable = True


class AddressInUse(ConfigError):
    """A node or router cannot listen where its config says: another process has that address
    (raised locally at start; ``except ConfigError`` catches it too)."""

    code = 40
    name = "ADDRESS_IN_USE"


class QueueMoved(FabricError):
    """The queue's partition is sealed: it is being moved to another cluster of the federation
    (``fabric queue move``), and this copy takes no writes (the source after its cut-over, the
    destination until it). Nothing was written; retry, on the cluster the federation directory
    (``/federation/queues/<queue>``) names once the move has switched it."""

    code = 45
    name = "QUEUE_MOVED"
    retriable = True


class QueueElsewhere(FabricError):
    """A router of a federated cluster was asked about a federation queue that this cluster does
    not hold, or holds only a share of (a queue split over several clusters): the reply names
    where it lives (``queue``; ``partitions``: the cluster of each partition, by index;
    ``routers``: each of those clusters' router endpoints). The client follows: it sends to those
    routers (``fabric/client/federated.py``). Not an error a caller sees from fabric's clients."""

    code = 41
    name = "QUEUE_ELSEWHERE"


class ClusterUnavailable(FabricError):
    """A federated cluster's router has no live store: each one it knew is gone (killed, stopped, cut off;
    its registration's lease lapsed). Retriable, but counted against a producer's ``retries``
    (unlike NOT_LEADER, which waits out an election): a whole cluster down is no election, and in
    a federation the other clusters' queues and partitions go on. The message names the cluster."""

    code = 42
    name = "CLUSTER_UNAVAILABLE"
    retriable = True


class PartitionRetired(FabricError):
    """A partition that shrinking retires (``auto_partitions_min``, docs/architecture.md
    "Shrinking") takes no new writes. Details: ``partitions``, the queue's live partition count,
    and ``retiring``: true while the partition is still read (a keyed batch waits and retries,
    so its keys keep their order), false once it is gone (the batch goes to ``p % partitions``,
    where its keys hash now)."""

    code = 43
    name = "PARTITION_RETIRED"
    retriable = True


class InternalError(FabricError):
    code = 50
    name = "INTERNAL_ERROR"


_BY_CODE: dict[int, type[FabricError]] = {}


def _register(cls: type[FabricError]) -> None:
    for sub in cls.__subclasses__():
        _BY_CODE.setdefault(sub.code, sub)
        _register(sub)


_register(FabricError)


def error_for_code(code: int, message: str = "") -> FabricError:
    """The exception a reply with status ``code`` stands for."""
    cls = _BY_CODE.get(code, InternalError)
    err = cls(message)
    if cls is InternalError and code != InternalError.code:
        err.message = f"error code {code}: {message}"
    return err


def all_codes() -> dict[int, str]:
    """Every code and its name: the error space of docs/protocol.md."""
    return {code: cls.name for code, cls in sorted(_BY_CODE.items())}
