"""The params of each request as its handler reads them: one ``TypedDict`` per op.

:func:`fabric.protocol.ops.validate` returns a plain dict; these types say what is in it for
each op: every param of the op's table (``SCHEMAS``), the optional ones with their defaults
filled in, so every key is present. They cost nothing at run time (a ``TypedDict`` is a dict);
mypy checks a handler's ``params["..."]`` against them: the name, and the type of what it reads.
``REQUEST_TYPES`` maps each op to its type; a test keeps them and ``SCHEMAS`` in step.

Ranges (ACK, NACK, CHANGE_VISIBILITY, UNSUBSCRIBE's release) are ``{"<partition>": [[start,
end], ...]}`` and offsets (COMMIT, SUBSCRIBE) ``{"<partition>": offset}``: JSON object keys are
strings. Pure code.
"""

from __future__ import annotations

from typing import Any, TypedDict

from fabric.protocol.ops import Op

Ranges = dict[str, list[list[int]]]  # partition (a decimal string) -> [[start, end), ...]
Offsets = dict[str, int]  # partition (a decimal string) -> offset


class PingParams(TypedDict):
    node: str | None


class HeartbeatParams(TypedDict):
    pass


class ProduceParams(TypedDict):
    queue: str
    partition: int
    acks: str  # "none", "leader" or "all"
    delay_ms: int | None
    deliver_at_ms: int | None
    priority: int | None
    dedup_ids: list[str | None] | None
    move_copy: int | None  # a federation move's copy: let into a sealed queue, stored at this offset only


class FetchParams(TypedDict):
    queue: str
    partition: int
    offset: int
    max_bytes: int
    wait_ms: int


class SubscribeParams(TypedDict):
    queue: str
    group: str | None
    partitions: list[int] | None
    start: str | int  # "committed", "earliest", "latest" or an offset
    offsets: Offsets | None
    kind: str  # "stream", "queue", "key_shared" or "direct"
    visibility_ms: int | None
    session_timeout_ms: int
    credit_messages: int
    credit_bytes: int
    endpoint: str | None
    replaces: int | None
    cluster: str | None  # a federation client addressing this cluster's share (read by routers)


class CreditParams(TypedDict):
    subscription: int
    messages: int
    bytes: int


class UnsubscribeParams(TypedDict):
    subscription: int
    release: Ranges | None
    keep_leases: bool


class AckParams(TypedDict):
    subscription: int
    ranges: Ranges
    durable: bool


class NackParams(TypedDict):
    subscription: int
    ranges: Ranges
    delay_ms: int
    uncount: bool


class ChangeVisibilityParams(TypedDict):
    subscription: int
    ranges: Ranges
    visibility_ms: int


class RevokedParams(TypedDict):
    subscription: int
    partitions: list[int]


class RedriveParams(TypedDict):
    queue: str
    max_messages: int
    reason: str | None
    dry_run: bool


class InitProducerParams(TypedDict):
    name: str | None


class ReplicaFetchParams(TypedDict):
    queue: str
    partition: int
    replica: str
    leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_bytes: int
    wait_ms: int
    delay_cursor: int
    high_watermark: int | None


class MetadataParams(TypedDict):
    queues: list[Any] | None  # queue names (not checked one by one: unknown names are left out)
    settings: bool
    settings_from: str | None
    settings_limit: int


class AclListParams(TypedDict):
    principal: str | None


class AclChangeParams(TypedDict):  # ACL_ADD and ACL_REMOVE
    principal: str
    operation: str
    resource: str


class QuotaSetParams(TypedDict):
    target: str
    messages_per_s: int
    bytes_per_s: int
    burst_ms: int


class NoParams(TypedDict):  # QUOTA_LIST, CLUSTER_STATUS
    pass


class CommitParams(TypedDict):
    queue: str
    group: str
    offsets: Offsets
    subscription: int | None
    forget: bool


class CommittedParams(TypedDict):
    queue: str
    group: str


class CreateQueueParams(TypedDict):
    name: str
    settings: dict[str, Any]  # checked by fabric.settings.QueueSettings
    if_not_exists: bool
    forwarded: bool
    leader_hint: str | None


class DeleteQueueParams(TypedDict):
    name: str
    if_exists: bool
    forwarded: bool


class AlterQueueParams(TypedDict):
    name: str
    partitions: int | None
    settings: dict[str, Any] | None
    forwarded: bool


# "from" is a keyword: the functional form
ListQueuesParams = TypedDict("ListQueuesParams", {"from": str | None, "limit": int, "prefix": str | None})


class DescribeQueueParams(TypedDict):
    name: str
    auto_create: bool
    cluster: str | None  # a federation client addressing this cluster's share (read by routers)


class ListOffsetsParams(TypedDict):
    queue: str
    partition: int
    at: str | int  # "earliest", "latest" or a timestamp (ms)


class PurgeParams(TypedDict):
    queue: str
    partition: int


class SettleParams(TypedDict):
    queue: str
    group: str
    member: int
    action: str  # "ack", "nack" or "visibility"
    ranges: Ranges
    delay_ms: int
    visibility_ms: int
    uncount: bool


REQUEST_TYPES: dict[Op, type] = {
    Op.PING: PingParams,
    Op.HEARTBEAT: HeartbeatParams,
    Op.PRODUCE: ProduceParams,
    Op.FETCH: FetchParams,
    Op.SUBSCRIBE: SubscribeParams,
    Op.CREDIT: CreditParams,
    Op.UNSUBSCRIBE: UnsubscribeParams,
    Op.ACK: AckParams,
    Op.NACK: NackParams,
    Op.CHANGE_VISIBILITY: ChangeVisibilityParams,
    Op.REVOKED: RevokedParams,
    Op.REDRIVE: RedriveParams,
    Op.INIT_PRODUCER: InitProducerParams,
    Op.REPLICA_FETCH: ReplicaFetchParams,
    Op.METADATA: MetadataParams,
    Op.ACL_LIST: AclListParams,
    Op.ACL_ADD: AclChangeParams,
    Op.ACL_REMOVE: AclChangeParams,
    Op.QUOTA_SET: QuotaSetParams,
    Op.QUOTA_LIST: NoParams,
    Op.CLUSTER_STATUS: NoParams,
    Op.COMMIT: CommitParams,
    Op.COMMITTED: CommittedParams,
    Op.CREATE_QUEUE: CreateQueueParams,
    Op.DELETE_QUEUE: DeleteQueueParams,
    Op.ALTER_QUEUE: AlterQueueParams,
    Op.LIST_QUEUES: ListQueuesParams,
    Op.DESCRIBE_QUEUE: DescribeQueueParams,
    Op.LIST_OFFSETS: ListOffsetsParams,
    Op.PURGE: PurgeParams,
    Op.SETTLE: SettleParams,
}
