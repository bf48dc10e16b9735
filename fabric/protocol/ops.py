"""The request catalogue: op codes and the params each request carries.

Each op has a table of params ``name -> Param``; :func:`validate` checks a
decoded params object against it and returns it with defaults filled in, or
raises ``BadParameter`` naming the param. Unknown params are rejected, so a typo
is an error rather than a silently ignored setting. Pure code.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from fabric.errors import BadParameter, UnknownCommand


class Op(IntEnum):
    PING = 1
    PRODUCE = 2
    FETCH = 3
    SUBSCRIBE = 4
    CREDIT = 5
    UNSUBSCRIBE = 6
    COMMIT = 7
    COMMITTED = 8
    CREATE_QUEUE = 9
    DELETE_QUEUE = 10
    LIST_QUEUES = 11
    DESCRIBE_QUEUE = 12
    LIST_OFFSETS = 13
    PUSH = 14
    HEARTBEAT = 15
    ACK = 16
    NACK = 17
    CHANGE_VISIBILITY = 18
    REVOKED = 19
    ASSIGNMENT = 20  # server -> client event: partitions assigned to / revoked from a stream member
    REDRIVE = 21
    INIT_PRODUCER = 22
    REPLICA_FETCH = 23  # a follower node asks its partition's leader for record batches
    METADATA = 24  # the cluster map as this node knows it: nodes, leaders, ISRs
    ACL_LIST = 25  # authorization rules (admin on "*" only)
    ACL_ADD = 26
    ACL_REMOVE = 27
    QUOTA_SET = 28  # rate limits per queue or principal (admin)
    QUOTA_LIST = 29
    ALTER_QUEUE = 30  # add partitions to a queue, or change its settings that may change live (admin)
    CLUSTER_STATUS = 31  # nodes, routers, controller, partitions: what `fabric cluster status` shows
    PURGE = 32  # remove every visible message of a partition, keeping the queue (admin; at the leader)
    SETTLE = 33  # ack / nack / change visibility of leases a queue member left behind (receipt handles)


KNOWN_OPS = frozenset(int(op) for op in Op)
# Requests a client may send again when the link is lost with one in flight (the reply lost with
# it): reading, or setting to a value, so doing one twice is doing it once. ACK ignores offsets
# already settled. Any other request lost that way is reported as maybe done (ConnectionFailed).
RESENDABLE = frozenset(
    {
        Op.PING,
        Op.FETCH,
        Op.COMMITTED,
        Op.LIST_QUEUES,
        Op.DESCRIBE_QUEUE,
        Op.LIST_OFFSETS,
        Op.METADATA,
        Op.CLUSTER_STATUS,
        Op.ACL_LIST,
        Op.QUOTA_LIST,
        Op.COMMIT,
        Op.ACK,
        Op.HEARTBEAT,
        Op.QUOTA_SET,
        Op.CHANGE_VISIBILITY,
    }
)
QUEUE_NAME = re.compile(r"^(?=.{1,200}\Z)(__)?[A-Za-z0-9][A-Za-z0-9._-]*\Z")
INTERNAL_PREFIX = "__"  # the node's own queues (__usage): readable by clients, never written or created by them
GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}\Z")
PARTITION_KEY = re.compile(r"0|[1-9][0-9]{0,4}")
I64_MAX = 2**63 - 1
ACKS = ("none", "leader", "all")
START = ("committed", "earliest", "latest")
KINDS = ("stream", "queue", "key_shared", "direct")
RANGES_MAX = 10_000  # offset ranges in one ACK / NACK / CHANGE_VISIBILITY
WAIT_MS_MAX = 60_000
I32_MAX = 2**31 - 1
FETCH_BYTES_MAX = 64 * 1024 * 1024
DELAY_MS_MAX = 10 * 366 * 24 * 3600 * 1000  # delayed delivery: up to ten years ahead
TIME_MS_MAX = 2**62
PRIORITY_MAX = 9
DEDUP_IDS_MAX = 100_000  # records of a batch that carries dedup ids
DEDUP_ID_BYTES_MAX = 256
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Param:
    kind: type | tuple[type, ...]
    default: Any = _MISSING
    low: int | None = None
    high: int | None = None
    choices: tuple[Any, ...] | None = None
    pattern: re.Pattern[str] | None = None
    check: Callable[[Any], str | None] | None = None

    @property
    def required(self) -> bool:
        return self.default is _MISSING


def _partition_list(value: Any) -> str | None:
    if not value:
        return "must name at least one partition (or be null for all)"
    if not all(type(p) is int and 0 <= p < 65536 for p in value):
        return "must be a list of partition numbers (0-65535)"
    if len(set(value)) != len(value):
        return "lists a partition twice"
    return None


def _dedup_ids(value: Any) -> str | None:
    if not value or len(value) > DEDUP_IDS_MAX:
        return f"must list 1..{DEDUP_IDS_MAX} ids, one per record (null for a record without one)"
    for i, v in enumerate(value):
        if v is not None and (not isinstance(v, str) or not 0 < len(v.encode()) <= DEDUP_ID_BYTES_MAX):
            return f"entry {i} must be null or a string of 1..{DEDUP_ID_BYTES_MAX} bytes"
    return None


def _offset_map(value: Any) -> str | None:
    for key, off in value.items():
        if not isinstance(key, str) or not PARTITION_KEY.fullmatch(key) or int(key) > 65535:
            return f"has key {key!r}, which is not a partition number"
        if type(off) is not int or not 0 <= off <= I64_MAX:
            return f"has a bad offset for partition {key}"
    return None


def _range_map(value: Any) -> str | None:
    problem = _offset_keys(value)
    if problem:
        return problem
    total = 0
    for key, ranges in value.items():
        if not isinstance(ranges, list):
            return f"for partition {key} must be a list of [start, end] pairs"
        total += len(ranges)
        for r in ranges:
            ok = isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
            if not ok or not 0 <= r[0] < r[1] <= I64_MAX:
                return f"for partition {key} has {r!r}, not a [start, end] pair with start < end"
    if total > RANGES_MAX:
        return f"holds {total} ranges; at most {RANGES_MAX} per request"
    return None


def _offset_keys(value: Any) -> str | None:
    for key in value:
        if not isinstance(key, str) or not PARTITION_KEY.fullmatch(key) or int(key) > 65535:
            return f"has key {key!r}, which is not a partition number"
    return None


QUEUE = Param(str, pattern=QUEUE_NAME)
PARTITION = Param(int, low=0, high=65535)
OFFSET = Param(int, low=0, high=I64_MAX)
GROUP = Param(str, pattern=GROUP_NAME)

SCHEMAS: dict[Op, dict[str, Param]] = {
    # node: through a router, the store that should answer (the router sends it there when it has
    # that store in its map; a store answers whatever is named: the reply's "node" says who did)
    Op.PING: {"node": Param((str, type(None)), None, pattern=GROUP_NAME)},
    Op.HEARTBEAT: {},
    Op.PRODUCE: {
        "queue": QUEUE,
        "partition": PARTITION,
        "acks": Param(str, "leader", choices=ACKS),
        # message properties: they apply to every record of every batch in the request
        "delay_ms": Param((int, type(None)), None, low=0, high=DELAY_MS_MAX),
        "deliver_at_ms": Param((int, type(None)), None, low=0, high=TIME_MS_MAX),
        "priority": Param((int, type(None)), None, low=0, high=PRIORITY_MAX),
        "dedup_ids": Param((list, type(None)), None, check=_dedup_ids),
        # a federation move's copy (fabric queue move): the source's batches into the sealed
        # destination, stored only if the partition's log ends at this offset (else OFFSET_OUT_OF_RANGE)
        "move_copy": Param((int, type(None)), None, low=0, high=I64_MAX),
    },
    Op.FETCH: {
        "queue": QUEUE,
        "partition": PARTITION,
        "offset": OFFSET,
        "max_bytes": Param(int, 1024 * 1024, low=1, high=FETCH_BYTES_MAX),
        "wait_ms": Param(int, 0, low=0, high=WAIT_MS_MAX),
    },
    Op.SUBSCRIBE: {
        "queue": QUEUE,
        "group": Param((str, type(None)), None, pattern=GROUP_NAME),
        "partitions": Param((list, type(None)), None, check=_partition_list),
        "start": Param((str, int), "committed", low=0, high=I64_MAX, choices=START),
        "offsets": Param((dict, type(None)), None, check=_offset_map),
        "kind": Param(str, "stream", choices=KINDS),
        "visibility_ms": Param((int, type(None)), None, low=1, high=12 * 3600 * 1000),
        # the node's [limits] min/max_session_timeout_ms bound it further
        "session_timeout_ms": Param(int, 10_000, low=1, high=24 * 3600 * 1000),
        "credit_messages": Param(int, 10_000, low=1, high=10_000_000),
        "credit_bytes": Param(int, 16 * 1024 * 1024, low=1024, high=1024 * 1024 * 1024),
        # kind "direct": where this consumer's PULL socket listens (a direct queue's producers send there)
        "endpoint": Param((str, type(None)), None),
        # the subscription this consumer held before it lost its link (a router or node failover):
        # the node ends it now, so its partitions and leases need not wait for its session to expire
        "replaces": Param((int, type(None)), None, low=1, high=I64_MAX),
        # a federation client addressing this cluster's share of a split queue (docs/federation.md)
        "cluster": Param((str, type(None)), None),
    },
    Op.CREDIT: {
        "subscription": Param(int, low=1, high=I64_MAX),
        "messages": Param(int, 0, low=0, high=10_000_000),
        "bytes": Param(int, 0, low=0, high=1024 * 1024 * 1024),
    },
    Op.UNSUBSCRIBE: {
        "subscription": Param(int, low=1, high=I64_MAX),
        # queue / key_shared: leased ranges the client never handed out, given back uncounted
        "release": Param((dict, type(None)), None, check=_range_map),
        # queue: the member's other leases stay until their visibility timeout, settled by SETTLE
        "keep_leases": Param(bool, False),
    },
    Op.ACK: {
        "subscription": Param(int, low=1, high=I64_MAX),
        "ranges": Param(dict, check=_range_map),
        # reply only once the group's state (these acks included) is on disk
        "durable": Param(bool, False),
    },
    Op.NACK: {
        "subscription": Param(int, low=1, high=I64_MAX),
        "ranges": Param(dict, check=_range_map),
        "delay_ms": Param(int, 0, low=0, high=12 * 3600 * 1000),
        "uncount": Param(bool, False),
    },
    Op.CHANGE_VISIBILITY: {
        "subscription": Param(int, low=1, high=I64_MAX),
        "ranges": Param(dict, check=_range_map),
        "visibility_ms": Param(int, low=0, high=12 * 3600 * 1000),
    },
    Op.REVOKED: {"subscription": Param(int, low=1, high=I64_MAX), "partitions": Param(list, check=_partition_list)},
    Op.REDRIVE: {
        "queue": QUEUE,
        "max_messages": Param(int, 1_000_000, low=1, high=100_000_000),
        "reason": Param((str, type(None)), None),
        "dry_run": Param(bool, False),
    },
    Op.INIT_PRODUCER: {"name": Param((str, type(None)), None, pattern=GROUP_NAME)},
    Op.REPLICA_FETCH: {
        "queue": QUEUE,
        "partition": PARTITION,
        "replica": Param(str, pattern=GROUP_NAME),
        "leader_epoch": Param(int, low=0, high=I32_MAX),
        "fetch_offset": OFFSET,
        "last_fetched_epoch": Param(int, low=-1, high=I32_MAX),
        "max_bytes": Param(int, 4 * 1024 * 1024, low=1, high=FETCH_BYTES_MAX),
        "wait_ms": Param(int, 0, low=0, high=WAIT_MS_MAX),
        "delay_cursor": Param(int, 0, low=0, high=I64_MAX),
        # the follower's high watermark: a leader whose own is ahead answers at once (no long poll)
        "high_watermark": Param((int, type(None)), None, low=0, high=I64_MAX),
    },
    # settings: also what a producer needs of every queue the node holds (one look-up for many queues)
    # paged: from the name settings_from, at most settings_limit queues (the reply names the next page's first)
    Op.METADATA: {
        "queues": Param((list, type(None)), None),
        "settings": Param(bool, False),
        "settings_from": Param((str, type(None)), None),
        "settings_limit": Param(int, 2000, low=1, high=5000),
    },
    Op.ACL_LIST: {"principal": Param((str, type(None)), None)},
    Op.ACL_ADD: {"principal": Param(str), "operation": Param(str), "resource": Param(str)},
    Op.ACL_REMOVE: {"principal": Param(str), "operation": Param(str), "resource": Param(str)},
    Op.QUOTA_SET: {
        "target": Param(str),
        "messages_per_s": Param(int, 0, low=0, high=I64_MAX),
        "bytes_per_s": Param(int, 0, low=0, high=I64_MAX),
        "burst_ms": Param(int, 1000, low=1, high=60_000),
    },
    Op.QUOTA_LIST: {},
    Op.CLUSTER_STATUS: {},
    Op.COMMIT: {
        "queue": QUEUE,
        "group": GROUP,
        "offsets": Param(dict, check=_offset_map),
        "subscription": Param((int, type(None)), None, low=1, high=I64_MAX),
        "forget": Param(bool, False),  # remove the group's committed offsets instead (offsets: {})
    },
    Op.COMMITTED: {"queue": QUEUE, "group": GROUP},
    # CREATE_QUEUE's settings are checked by fabric.settings.QueueSettings, which names the key.
    Op.CREATE_QUEUE: {
        "name": QUEUE,
        "settings": Param(dict, {}),
        "if_not_exists": Param(bool, False),
        "forwarded": Param(bool, False),  # cluster: sent on by a node to the controller's node
        "leader_hint": Param((str, type(None)), None),  # cluster: lead every partition here if placed here
    },
    Op.DELETE_QUEUE: {"name": QUEUE, "if_exists": Param(bool, False), "forwarded": Param(bool, False)},
    # partitions' range is checked by fabric.settings.grow_problem against the queue's settings;
    # settings (the keys that may change live) by fabric.settings.alter_problem. One of the two.
    Op.ALTER_QUEUE: {
        "name": QUEUE,
        "partitions": Param((int, type(None)), None, low=1, high=4096),
        "settings": Param((dict, type(None)), None),
        "forwarded": Param(bool, False),
    },
    # paged by name: from the name "from" on, at most "limit" queues (the reply names the next page's first)
    Op.LIST_QUEUES: {
        "from": Param((str, type(None)), None),
        "limit": Param(int, 1000, low=1, high=5000),
        "prefix": Param((str, type(None)), None),
    },
    # auto_create: a producer's first look; the node creates the queue if [node] auto_create_queues
    # cluster: a federation client addressing this cluster's share of a queue (docs/federation.md)
    Op.DESCRIBE_QUEUE: {"name": QUEUE, "auto_create": Param(bool, False), "cluster": Param((str, type(None)), None)},
    Op.PURGE: {"queue": QUEUE, "partition": PARTITION},
    Op.SETTLE: {
        "queue": QUEUE,
        "group": GROUP,
        "member": Param(int, low=1, high=I64_MAX),  # the subscription that received them and left
        "action": Param(str, choices=("ack", "nack", "visibility")),
        "ranges": Param(dict, check=_range_map),
        "delay_ms": Param(int, 0, low=0, high=12 * 3600 * 1000),  # nack
        "visibility_ms": Param(int, 0, low=0, high=12 * 3600 * 1000),  # visibility
        # nack: the member never handed them to its application (pushed while it was leaving), so
        # this delivery does not count toward max_receive_count
        "uncount": Param(bool, False),
    },
    Op.LIST_OFFSETS: {
        "queue": QUEUE,
        "partition": PARTITION,
        "at": Param((str, int), "latest", low=0, high=I64_MAX, choices=("earliest", "latest")),
    },
}


def _check(op: Op, name: str, spec: Param, value: Any) -> None:
    kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
    if type(value) not in kinds:  # exact: True is not an int here
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise BadParameter(f"{_where(op, name)} must be {names}, got {type(value).__name__}")
    if isinstance(value, str):
        if spec.choices is not None and spec.pattern is None and value not in spec.choices:
            choices = ", ".join(map(str, spec.choices))
            raise BadParameter(f"{_where(op, name)} must be one of {choices}, got {value!r}")
        if spec.pattern is not None and not spec.pattern.match(value):
            allowed = "A-Za-z0-9._:-" if spec.pattern is GROUP_NAME else "A-Za-z0-9._-"
            raise BadParameter(f"{_where(op, name)} {value!r} is not a valid name ([{allowed}], 1-200 chars)")
    too_low = spec.low is not None and type(value) is int and value < spec.low
    if too_low or (spec.high is not None and type(value) is int and value > spec.high):
        raise BadParameter(f"{_where(op, name)} must be in {spec.low}..{spec.high}, got {value}")
    if spec.check is not None and value is not None:
        problem = spec.check(value)
        if problem:
            raise BadParameter(f"{_where(op, name)} {problem}")


def _where(op: Op, name: str) -> str:
    """The start of an error message, made only when one is raised (validation is on every request)."""
    return f"{op.name} param {name!r}"


# A consumer's COMMIT of one partition, as fabric's clients encode it, comes at the rate of the
# data (a committing consumer sends one per poll): read by one regex match instead of a JSON parse
# and a schema check. The character classes are QUEUE_NAME's and GROUP_NAME's (no "__" internal
# queues: those take the general path), so whatever matches is valid but for the numbers' ranges.
_COMMIT_ONE = re.compile(
    rb'\{"queue":"([A-Za-z0-9][A-Za-z0-9._-]{0,199})","group":"([A-Za-z0-9][A-Za-z0-9._:-]{0,199})",'
    rb'"offsets":\{"(0|[1-9][0-9]{0,4})":(0|[1-9][0-9]{0,18})\}(?:,"subscription":(null|[1-9][0-9]{0,18}))?\}'
)


def commit_params(raw: Any) -> dict[str, Any] | None:
    """COMMIT params of one partition as ``validate`` would return them, or None when ``raw`` is
    not in the clients' form (then it takes the general path, which names any problem)."""
    if type(raw) is not bytes:
        raw = bytes(raw)
    m = _COMMIT_ONE.fullmatch(raw)
    if m is None:
        return None
    queue, group, partition, offset, sub = m.groups()
    off = int(offset)
    subscription = None if sub is None or sub == b"null" else int(sub)
    if int(partition) > 65535 or off > I64_MAX or (subscription is not None and subscription > I64_MAX):
        return None
    return {
        "queue": queue.decode(),
        "group": group.decode(),
        "offsets": {partition.decode(): off},
        "subscription": subscription,
        "forget": False,
    }


def validate(op: Op, params: dict[str, Any]) -> dict[str, Any]:
    """Check ``params`` against the op's table; return them with defaults filled in."""
    schema = SCHEMAS.get(op)
    if schema is None:
        raise UnknownCommand(f"{op.name} is not a request")
    unknown = set(params) - set(schema)
    if unknown:
        raise BadParameter(f"{op.name} has no param {sorted(unknown)[0]!r}")
    out: dict[str, Any] = {}
    for name, spec in schema.items():
        if name in params:
            value = params[name]
            _check(op, name, spec, value)
            out[name] = value
        elif spec.required:
            raise BadParameter(f"{op.name} needs param {name!r}")
        else:
            out[name] = copy.copy(spec.default)
    return out
