"""The broker: validates every request and dispatches it to the store and push tiers.

Theory of operation
-------------------
``handle(client, frames)`` takes one request exactly as it came off the ROUTER
socket (routing id stripped) and answers through the ``send`` function it was
given. Every bad input (malformed frame, unknown op, bad param, unknown queue,
oversize message or batch, corrupt batch, full queue, full disk) becomes an error
reply with its code; the client and the process live on.

PRODUCE is the hot path and does per-batch work only: one CRC check, one stamp of
the base offset, one write. What a consumer may see is bounded by each
partition's *visible* offset: for ``fsync = "always"`` queues that is the durable
watermark, advanced when the group-commit flusher reports a generation synced
(:meth:`on_synced`); a producer's ``acks=leader`` reply is sent at the same
moment, so an acknowledged message is on disk and no consumer ever sees a message
that a crash could take back. For ``interval``/``never`` queues it is the log end.

Deferred work (parked long-poll fetches, pending fsync acks, session expiry,
retention) is driven by :meth:`tick` with the time passed in.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

from fabric import __version__
from fabric.errors import (
    BadParameter,
    ConfigError,
    DiskFull,
    FabricError,
    InternalError,
    NotAuthorized,
    NotLeaseHolder,
    OffsetOutOfRange,
    ProducerFenced,
    ProtocolError,
    RequestTooLarge,
    StorageError,
    UnknownPartition,
    UnknownQueue,
    UnknownSubscription,
)
from fabric.histogram import LATENCY_BUCKETS, Histogram
from fabric.node import cluster_policy
from fabric.node.autoexpand import AutoExpand
from fabric.node.cluster_queues import ClusterQueues
from fabric.node.dedup import QueueDedup
from fabric.node.describe import describe_queue, list_page, queue_summary
from fabric.node.expiry import Expiry
from fabric.node.heap import Heap
from fabric.node.idle_poll import IdlePoll
from fabric.node.notices import Notices
from fabric.node.ordering import StrictOrdering
from fabric.node.produce import Deferred, produce
from fabric.node.purge import purge_partition
from fabric.node.quotas import Quota, Quotas
from fabric.node.replication import Replication
from fabric.node.shared import DLQ_SUFFIX, SharedGroups
from fabric.node.streams import StreamGroups
from fabric.node.timers import DelayedDelivery
from fabric.node.usage import UsageRecorder
from fabric.protocol import frames as fr
from fabric.protocol.admission import NODE, ParamsCache, admit_header, error_reply
from fabric.protocol.batch import HAS_TTL, batch_record_count, check_batch, whole_prefix
from fabric.protocol.ops import INTERNAL_PREFIX, Op
from fabric.protocol.requests import (
    AckParams,
    AclChangeParams,
    AclListParams,
    AlterQueueParams,
    ChangeVisibilityParams,
    CommitParams,
    CommittedParams,
    CreateQueueParams,
    CreditParams,
    DeleteQueueParams,
    DescribeQueueParams,
    FetchParams,
    HeartbeatParams,
    InitProducerParams,
    ListOffsetsParams,
    ListQueuesParams,
    MetadataParams,
    NackParams,
    NoParams,
    PingParams,
    ProduceParams,
    PurgeParams,
    QuotaSetParams,
    RedriveParams,
    ReplicaFetchParams,
    RevokedParams,
    SettleParams,
    SubscribeParams,
    UnsubscribeParams,
)
from fabric.push.credit import Credit
from fabric.push.subscriptions import Pusher, Subscription, Subscriptions
from fabric.settings import NodeConfig, QueueSettings
from fabric.store.flusher import Flusher
from fabric.store.store import Store

log = logging.getLogger("fabric.broker")
SETTINGS_PAGE_BYTES = 512 * 1024  # METADATA settings: a page's params stay well under the 1 MiB frame ceiling
SETTINGS_ENTRY_BYTES = 160  # a queue's entry there, not counting its name (about 110 bytes encoded)
TIMED_OPS = (Op.PRODUCE, Op.FETCH, Op.COMMIT, Op.ACK, Op.SUBSCRIBE, Op.DESCRIBE_QUEUE)  # request-time histograms
PUSH_HEADER = fr.HEADER.pack(fr.MAGIC, fr.VERSION, Op.PUSH, fr.FLAG_EVENT, 0, 0, 0)[:8]

SendFn = Callable[[bytes, list[Any]], bool]  # (client, frames) -> False if the client is gone
# a request's handler; its params are the op's fabric.protocol.requests type (Any here: one per op)
Handler = Callable[[bytes, fr.Header, Any, Sequence[Any]], dict[str, Any] | None]
TICK_MS = 100
SESSION_CHECK_MS = 200  # consumers may ask for session timeouts down to [limits] min_session_timeout_ms
RETENTION_CHECK_MS = 10_000  # every queue's retention is applied once in this long...
RETENTION_SLICE_MS = 1_000  # ...a slice of the queues this often (10,000 at once held the loop ~20 ms)
PRODUCER_SAVE_MS = 10_000  # how often partitions that rolled a segment snapshot their producer state


class Broker:
    def __init__(self, config: NodeConfig, store: Store, flusher: Flusher, send: SendFn, *, now_ms: int) -> None:
        self.config = config
        self.store = store
        self.flusher = flusher
        self._send = send
        self.subs = Subscriptions()
        self.pusher = Pusher(self.subs, self._read_pushed, self._push)
        self.shared = SharedGroups(self)
        self.streams = StreamGroups(self)
        self.subs.on_remove = self.streams.on_remove
        # True when no request is waiting to be read: the server sets it. Then the consumers are
        # pushed to before the producer's reply goes out (the consumer's latency is the one that
        # counts); under load, requests are waiting and pushes go once per burst instead.
        self.idle: Callable[[], bool] = lambda: False
        self.timers = DelayedDelivery(self)
        self.dedup = QueueDedup(self)
        self.expiry = Expiry(self)
        self.ordering = StrictOrdering(self)
        self._visible: dict[tuple[str, int], int] = {}
        self._pending_sync: deque[tuple[int, str, int, int, bytes | None, list[Any] | None, bool]] = deque()
        self._parked: list[tuple[int, bytes, fr.Header, FetchParams]] = []
        self._seen: dict[bytes, int] = {}
        self._params_cache: ParamsCache = {}  # validated params by their bytes (fabric.protocol.admission)
        self.access: Any = None  # fabric.node.access.AccessGuard when [security] keys_dir is set
        self.quotas = Quotas()
        stored = store.meta.quotas() if config.cluster is None else []  # a cluster's are in etcd
        for raw in [*config.quotas, *stored]:  # runtime settings override the config's
            try:
                self.quotas.set(Quota.checked(**raw), now_ms)
            except (FabricError, TypeError) as exc:
                raise ConfigError(f"quota {raw!r}: {exc}") from None
        self.endpoint = config.listen  # where the server bound (it sets it): CLUSTER_STATUS names it
        self.direct_endpoints: dict[str, dict[int, str]] = {}  # direct queue -> subscription id -> PULL endpoint
        self._now_ms = now_ms
        self._next_session_check = now_ms + SESSION_CHECK_MS
        self._next_retention = now_ms + RETENTION_SLICE_MS
        self._retention_todo: list[str] = []  # this round's queues still to look at, last first
        self._retention_count = 0  # how many of them each slice looks at
        self._retention_holders: dict[str, list[str]] | None = None  # this round's spark.* groups
        self._retention_round: set[str] = set()  # every queue this round looks at
        self._retention_shape = (0, 0)  # the store's shape when the round was last looked at
        self._next_producer_save = now_ms + PRODUCER_SAVE_MS
        self.stats = {"requests": 0, "errors": 0, "batches_in": 0, "records_in": 0, "dropped_replies": 0}
        # metrics (fabric.node.metrics reads them at scrape time): per request, never per message
        self.op_counts = [0] * 256
        self.error_counts: dict[str, int] = {}
        self.queue_in: dict[str, list[int]] = {}  # queue -> [messages, bytes] stored by PRODUCE
        self.latency = {int(op): Histogram(LATENCY_BUCKETS) for op in TIMED_OPS}
        self.usage = UsageRecorder(self, config.usage_interval_ms, now_ms)  # ticks on a single node only
        self.notices = Notices(log)  # rate-limited operator lines: dead letters, full disk, fencing
        # replicated partitions (a cluster node): set by the server; None on the embedded single node
        self.replication: Replication | None = None
        self.heap: Heap | None = None  # the collector's pauses, set by the server (fabric.node.heap)
        self.idle_poll: IdlePoll | None = None  # the loop's busy-polling, set by the server (its metrics)
        self.cluster_ops: Any = None  # the server's cluster thread: queue create/delete go through etcd
        self.cluster_queues = ClusterQueues(self)  # a cluster's queue requests (unused by a single node)
        self.auto_expand = AutoExpand(self)  # queues with auto_partitions_max grow under load
        self._handlers: dict[int, Handler] = {
            Op.PING: self._ping,
            Op.HEARTBEAT: self._heartbeat,
            Op.PRODUCE: self._produce,
            Op.FETCH: self._fetch,
            Op.SUBSCRIBE: self._subscribe,
            Op.CREDIT: self._credit,
            Op.UNSUBSCRIBE: self._unsubscribe,
            Op.COMMIT: self._commit,
            Op.COMMITTED: self._committed,
            Op.CREATE_QUEUE: self._create_queue,
            Op.DELETE_QUEUE: self._delete_queue,
            Op.ALTER_QUEUE: self._alter_queue,
            Op.LIST_QUEUES: self._list_queues,
            Op.DESCRIBE_QUEUE: self._describe_queue,
            Op.LIST_OFFSETS: self._list_offsets,
            Op.ACK: self._ack,
            Op.NACK: self._nack,
            Op.CHANGE_VISIBILITY: self._change_visibility,
            Op.REDRIVE: self._redrive,
            Op.REVOKED: self._revoked,
            Op.INIT_PRODUCER: self._init_producer,
            Op.REPLICA_FETCH: self._replica_fetch,
            Op.METADATA: self._metadata,
            Op.QUOTA_SET: self._quota_set,
            Op.QUOTA_LIST: self._quota_list,
            Op.ACL_LIST: self._acl_list,
            Op.ACL_ADD: self._acl_change,
            Op.ACL_REMOVE: self._acl_change,
            Op.CLUSTER_STATUS: self._cluster_status,
            Op.PURGE: self._purge,
            Op.SETTLE: self._settle,
        }
        for name in store.queue_names():
            for p in range(store.settings(name).log_partitions):
                self._visible[(name, p)] = store.partition(name, p).next_offset

    # ------------------------------------------------------------------ entry points

    def handle(self, client: bytes, frames: Sequence[Any], now_ms: int) -> None:
        """One request from ``client``: reply now, later, or (acks=none) never."""
        self._now_ms = now_ms
        self._seen[client] = now_ms
        self.stats["requests"] += 1
        header: fr.Header | None = None
        params: dict[str, Any] | None = None
        started = perf_counter()
        try:
            if sum(map(len, frames)) > self.config.limits.max_request_bytes:
                raise RequestTooLarge(f"request exceeds {self.config.limits.max_request_bytes} bytes")
            if len(frames) < 2:
                raise ProtocolError(f"a message has at least 2 frames (header, params), got {len(frames)}")
            header = fr.decode_header(frames[0])
            self.op_counts[header.op] += 1
            op, params = admit_header(header, frames[1], NODE, self._params_cache)
            if self.access is not None:
                self.access.check(client, op, params)
            result = self._handlers[op](client, header, params, frames[2:])
        except Deferred:
            self._timed(header, started)
            return
        except FabricError as exc:
            if (
                isinstance(exc, UnknownQueue | UnknownPartition)
                and self.replication is not None
                and params is not None
                and self.cluster_queues.park_unknown(client, frames, params)
            ):
                return  # a queue this node has not heard of yet: asked of etcd, answered once known
            self._error(client, header, frames, exc)
            return
        except Exception as exc:  # a bug must not take the node down
            log.exception("internal error handling a request")
            self._error(client, header, frames, InternalError(f"{type(exc).__name__}: {exc}"))
            return
        if result is not None and not header.flags & fr.FLAG_NO_REPLY:
            self._reply(client, header, result)
        self._timed(header, started)

    def _timed(self, header: fr.Header | None, started: float) -> None:
        h = self.latency.get(header.op) if header is not None else None
        if h is not None:
            h.observe(perf_counter() - started)

    def on_synced(self, generation: int) -> None:
        """The flusher has made every write requested up to ``generation`` durable: consumers
        see it (pushed first), then its producers get their replies."""
        replies = []
        while self._pending_sync and self._pending_sync[0][0] <= generation:
            _, queue, p, upto, client, reply, acks_all = self._pending_sync.popleft()
            key = (queue, p)
            if self.replication is not None and key in self.replication.roles:
                if self.replication.leads(queue, p):
                    self.replication.on_durable(queue, p, upto, client, reply, acks_all)
                continue
            if key in self._visible and upto > self._visible[key]:
                self._visible[key] = upto
                self._on_visible(queue, p)
            if client is not None and reply is not None:
                replies.append((client, reply))
        self.deliver()
        for client, reply in replies:
            self._send_or_count(client, reply)
        if self.timers.moving:
            self.timers.on_synced(generation)

    def on_sync_failed(self, generation: int) -> None:
        """fdatasync failed: writes up to ``generation`` may not be durable. Tell their producers;
        the data stays invisible to consumers (the log refuses appends until reopened)."""
        while self._pending_sync and self._pending_sync[0][0] <= generation:
            _, queue, p, _upto, client, reply, _all = self._pending_sync.popleft()
            if client is not None and reply is not None:
                header = fr.decode_header(reply[0])
                self._error(client, header, (), StorageError(f"fsync failed on {queue}/{p}: the write is not durable"))
        if self.timers.moving:
            self.timers.on_sync_failed(generation)

    def tick(self, now_ms: int) -> None:
        self._now_ms = now_ms
        if self.replication is not None:
            self.replication.tick(now_ms)
            self.cluster_queues.release(now_ms)
        if self._parked:
            due = [p for p in self._parked if p[0] <= now_ms]
            if due:
                self._parked = [p for p in self._parked if p[0] > now_ms]
                for _, client, header, params in due:
                    self._answer_fetch(client, header, params, final=True)
        if now_ms >= self._next_session_check:
            self._next_session_check = now_ms + SESSION_CHECK_MS
            self._expire_sessions(now_ms)
        self.auto_expand.tick(now_ms)
        if self.shared.groups:
            self.shared.tick(now_ms)
            if self.expiry.ttl_queues:
                self.expiry.tick(now_ms)
        self.timers.tick(now_ms)
        if self.ordering.held:
            self.ordering.tick(now_ms)
        if now_ms >= self._next_producer_save:
            self._next_producer_save = now_ms + PRODUCER_SAVE_MS
            try:
                self.store.save_producer_states()
            except FabricError:
                log.exception("could not save producer state; will retry")
        if self.streams.groups:
            self.streams.tick(now_ms)
        if self.replication is None:  # a cluster's usage records come with its front end (issue 10/12)
            self.usage.tick(now_ms)
        if now_ms >= self._next_retention:
            self._next_retention = now_ms + RETENTION_SLICE_MS
            self._retention_slice(now_ms)

    def _retention_slice(self, now_ms: int) -> None:
        """Retention for the next slice of the queues, every queue once in RETENTION_CHECK_MS; the
        subscriptions of their partitions move past what it deleted."""
        store = self.store
        shape = store.shape()
        if not self._retention_todo:
            names = store.queue_names()
            self._retention_todo = names[::-1]
            self._retention_round = set(names)
            self._retention_count = -(-len(names) * RETENTION_SLICE_MS // RETENTION_CHECK_MS)
            self._retention_holders = None
        elif shape != self._retention_shape:  # queues made since the round began join it, first
            new = [n for n in store.queue_names() if n not in self._retention_round]
            self._retention_todo.extend(reversed(new))
            self._retention_round.update(new)
        self._retention_shape = shape
        todo = self._retention_todo
        count = self._retention_count
        names = [todo.pop() for _ in range(min(count, len(todo)))]
        try:
            if self._retention_holders is None:  # once a round: it reads the group table (sqlite)
                self._retention_holders = store.retention_holders()
            store.enforce_retention(now_ms, names, self._retention_holders)
        except FabricError:
            log.exception("retention pass failed")
        for name in names:
            if not store.has_queue(name):
                continue
            for p, plog in enumerate(store.partitions(name)):
                upto = self._visible.get((name, p))
                subs = self.subs.by_partition.get((name, p))
                if upto is None or not subs:
                    continue
                start = plog.log_start_offset
                for sub_id in subs:
                    sub = self.subs.by_id[sub_id]
                    sub.cursors[p] = max(sub.cursors[p], min(start, upto))

    def deliver(self) -> None:
        if self.subs.ready:
            self.pusher.deliver(self._now_ms)

    def next_timeout_ms(self, now_ms: int) -> int:
        if self.subs.ready:
            return 0  # more to push: the loop comes straight back
        deadline = min(self._next_session_check, now_ms + TICK_MS)
        if self._parked:
            deadline = min(deadline, min(p[0] for p in self._parked))
        for group_deadline in (
            self.shared.next_deadline_ms() if self.shared.groups else None,
            self.streams.next_deadline_ms() if self.streams.groups else None,
            self.timers.next_due_ms(),
            self.ordering.next_due_ms() if self.ordering.held else None,
        ):
            if group_deadline is not None:
                deadline = min(deadline, group_deadline)
        if self.replication is not None and (due := self.replication.next_due_ms()) is not None:
            deadline = min(deadline, due)
        return max(0, deadline - now_ms)

    def close(self) -> None:
        if self.replication is None and self.usage.interval_ms:
            self.usage.flush(self._now_ms)  # before the flusher's last sync
        self.shared.checkpoint(self._now_ms, force=True)
        for _, client, header, params in self._parked:
            self._answer_fetch(client, header, params, final=True)
        self._parked.clear()
        self.timers.close()

    # ------------------------------------------------------------------ replies

    def _reply(self, client: bytes, header: fr.Header, params: dict[str, Any], data: Sequence[Any] = ()) -> None:
        reply_header = fr.Header(header.op, header.request_id, fr.FLAG_REPLY)
        self._send_or_count(client, fr.encode(reply_header, params, data))

    def _send_or_count(self, client: bytes, frames: list[Any]) -> None:
        if not self._send(client, frames):
            self.stats["dropped_replies"] += 1

    def _error(self, client: bytes, header: fr.Header | None, frames: Sequence[Any], exc: FabricError) -> None:
        self.stats["errors"] += 1
        self.error_counts[exc.name] = self.error_counts.get(exc.name, 0) + 1
        if isinstance(exc, DiskFull):
            self.notices.note(
                self._now_ms, ("disk-full",), 1, f"disk full: refused {{n}} request(s): {exc.message}", logging.WARNING
            )
        elif isinstance(exc, ProducerFenced):
            self.notices.note(self._now_ms, ("fenced",), 1, f"producer fenced ({{n}} request(s)): {exc.message}")
        reply = error_reply(header, frames, exc)
        if reply is None:
            log.warning("dropped request with no reply wanted: %s: %s", exc.name, exc.message)
            return
        self._send_or_count(client, reply)

    # ------------------------------------------------------------------ produce

    def _produce(self, client: bytes, header: fr.Header, params: ProduceParams, data: Sequence[Any]) -> dict | None:
        if params["queue"].startswith(INTERNAL_PREFIX):
            raise BadParameter(
                f"queue {params['queue']!r}: names starting with '__' are the node's own; clients read them"
            )
        if self.replication is not None:
            self.replication.route(client, header, params, data)  # type: ignore[arg-type]  # Replication: dict params
        created = not self.store.has_queue(params["queue"]) and self._auto_create(params["queue"])
        if not created and self.store.settings(params["queue"]).mode == "direct":
            raise self._mode_mismatch(params["queue"], "direct", "send with a fabric Producer")
        throttle_ms = 0
        if self.quotas.active:
            principal = self.access.principals.get(client, "anonymous") if self.access is not None else "anonymous"
            messages = sum(batch_record_count(b) for b in data)
            throttle_ms = self.quotas.charge(principal, params["queue"], messages, sum(map(len, data)), self._now_ms)
        reply = produce(self, client, header, params, data, created=created, throttle_ms=throttle_ms)
        return {**reply, "created": True} if created and reply is not None else reply

    def _auto_create(self, name: str) -> bool:
        """A producer's first send to ``name``: create it ([node] auto_create_queues) or refuse
        with UNKNOWN_QUEUE saying how to create it."""
        if not self.config.auto_create_queues:
            raise UnknownQueue(
                f"queue {name!r} does not exist (create it with 'fabric queue create {name}', "
                f"or set [node] auto_create_queues = true)"
            )
        if name.endswith((DLQ_SUFFIX, ".late")):
            raise UnknownQueue(
                f"queue {name!r} does not exist; dead-letter and late queues are made for their queue, not on a send"
            )
        settings = self.config.queues.get(name, self.config.queue_defaults)
        self.create_queue(name, settings)
        log.info("queue %r created on first send (auto_create_queues): %d partition(s)", name, settings.partitions)
        return True

    def _partition(self, queue: str, p: int, settings: QueueSettings | None = None) -> Any:
        settings = settings or self.store.settings(queue)
        if p >= settings.log_partitions:
            raise UnknownPartition(f"queue {queue!r} has partitions 0..{settings.log_partitions - 1}, not {p}")
        return self.store.partition(queue, p)

    def _on_visible(self, queue: str, p: int) -> None:
        self.subs.on_data(queue, p)
        if self._parked:
            woken = [x for x in self._parked if x[3]["queue"] == queue and x[3]["partition"] == p]
            if woken:
                self._parked = [x for x in self._parked if not (x[3]["queue"] == queue and x[3]["partition"] == p)]
                for _, client, header, params in woken:
                    self._answer_fetch(client, header, params, final=True)

    # ------------------------------------------------------------------ fetch and push

    def _read_visible(self, queue: str, p: int, offset: int, max_bytes: int) -> tuple[bytes, int]:
        upto = self._visible.get((queue, p), 0)
        if offset >= upto:
            return b"", upto
        return self.store.partition(queue, p).read(offset, max_bytes), upto

    def _read_pushed(self, queue: str, p: int, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """The pusher's read: a partition that cannot be read (an encrypted one whose key id the
        key file lacks, a disk error) pushes nothing and says so in the log; FETCH gets the error."""
        try:
            return self._read_visible(queue, p, offset, max_bytes)
        except StorageError as exc:
            self.notices.note(
                self._now_ms,
                ("unreadable", queue, str(p)),
                1,
                f"{queue}/{p}: {{n}} push read(s) refused: {exc.message}",
                logging.ERROR,
            )
            return b"", self._visible.get((queue, p), 0)

    def _fetch(self, client: bytes, header: fr.Header, params: FetchParams, data: Sequence[Any]) -> dict | None:
        if self.replication is not None:
            self.replication.route(client, header, params, data)  # type: ignore[arg-type]  # Replication: dict params
        plog = self._partition(params["queue"], params["partition"])
        offset = params["offset"]
        if offset < plog.log_start_offset or offset > plog.next_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside {plog.log_start_offset}..{plog.next_offset} "
                f"of {params['queue']}/{params['partition']}"
            )
        if not self._answer_fetch(client, header, params, final=params["wait_ms"] == 0):
            self._parked.append((self._now_ms + params["wait_ms"], client, header, params))
        raise Deferred

    def _answer_fetch(self, client: bytes, header: fr.Header, params: FetchParams, *, final: bool) -> bool:
        queue, p = params["queue"], params["partition"]
        try:
            plog = self._partition(queue, p)
            data, upto = self._read_visible(queue, p, params["offset"], params["max_bytes"])
        except FabricError as exc:
            self._error(client, header, (), exc)
            return True
        data = bytes(data[: whole_prefix(data, upto)[0]]) if data else b""
        if not data and not final:
            return False
        reply = {"high_watermark": upto, "log_start_offset": plog.log_start_offset}
        self._reply(client, header, reply, [data] if data else [])
        return True

    def _push(
        self, client: bytes, sub_id: int, p: int, upto: int, chunk: memoryview, leases: list[list[int]] | None
    ) -> bool:
        # Per delivery: a preformatted header and params (same bytes json.dumps would give).
        header = PUSH_HEADER + sub_id.to_bytes(8, "little")
        if leases is None:
            params = b'{"partition":%d,"high_watermark":%d}' % (p, upto)
        else:
            spans = b",".join(b"[%d,%d,%d]" % (s, e, c) for s, e, c in leases)
            params = b'{"partition":%d,"high_watermark":%d,"leases":[%s]}' % (p, upto, spans)
        return self._send(client, [header, params, chunk])

    def _subscribe(self, client: bytes, header: fr.Header, params: SubscribeParams, data: Sequence[Any]) -> dict | None:
        queue = params["queue"]
        if self.replication is not None:
            coordinated = _coordinated(params)
            if coordinated:
                self.replication.check_coordinator(queue)
            self.replication.check_local(queue, params["partitions"], coordinated)
        settings = self.store.settings(queue)
        limits = self.config.limits
        if len(self.subs.by_client.get(client, ())) >= limits.max_subscriptions_per_client:
            raise BadParameter(f"a client may hold {limits.max_subscriptions_per_client} subscriptions")
        timeout = params["session_timeout_ms"]
        if not limits.min_session_timeout_ms <= timeout <= limits.max_session_timeout_ms:
            raise BadParameter(
                f"session_timeout_ms {timeout} is outside this node's bounds {limits.min_session_timeout_ms}.."
                f"{limits.max_session_timeout_ms} ([limits] min_session_timeout_ms, max_session_timeout_ms)"
            )
        if (settings.mode == "direct") != (params["kind"] == "direct"):
            raise self._mode_mismatch(queue, settings.mode, "subscribe with kind='direct'")
        old = self.subs.by_id.get(params["replaces"]) if params["replaces"] is not None else None
        if old is not None and old.client != client and old.queue == queue and old.group == params["group"]:
            # the same consumer back over another link: its old subscription ends now (its group
            # rebalances at once) instead of holding partitions until its session expires
            log.info("subscription %d of %r replaced by its consumer's new link: it ends now", old.id, queue)
            self.subs.remove(old.id)
        reply = self._subscribe_kind(client, params, settings)
        self.subs.by_id[reply["subscription"]].session_timeout_ms = timeout
        return reply

    @staticmethod
    def _mode_mismatch(queue: str, mode: str, what: str) -> BadParameter:
        if mode == "direct":
            exc = BadParameter(
                f"queue {queue!r} is a direct (brokerless) queue: producers send straight to its consumers; "
                f"{what} (the fabric client does)"
            )
        else:
            exc = BadParameter(f"queue {queue!r} is a log queue, not a direct one")
        exc.details = {"mode": mode}
        return exc

    def direct_consumers(self, queue: str) -> list[str]:
        """The PULL endpoints of a direct queue's live consumers (their sessions are live)."""
        out = []
        for sub_id in self.direct_endpoints.get(queue, {}).copy():
            sub = self.subs.by_id.get(sub_id)
            if sub is None or sub.queue != queue:
                del self.direct_endpoints[queue][sub_id]
            else:
                out.append(self.direct_endpoints[queue][sub_id])
        return sorted(set(out))

    def _subscribe_kind(self, client: bytes, params: SubscribeParams, settings: QueueSettings) -> dict[str, Any]:
        queue = params["queue"]
        if params["kind"] == "direct":
            endpoint = params["endpoint"]
            if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://")):
                raise BadParameter(
                    "a direct subscription names the consumer's PULL endpoint: endpoint='tcp://HOST:PORT'"
                )
            sub = Subscription(
                self.subs.new_id(), client, queue, None, {}, Credit(1, 1024), self._now_ms, kind="direct"
            )
            self.subs.add(sub)
            self.subs.ready.discard(sub.id)  # nothing is ever pushed to it: producers send to the endpoint
            self.direct_endpoints.setdefault(queue, {})[sub.id] = endpoint
            return {"subscription": sub.id, "partitions": {}, "direct": True}
        if params["kind"] != "stream":
            return self.shared.subscribe(client, params, settings, self._now_ms)
        if params["group"] and params["partitions"] is None and params["offsets"] is None:
            return self.streams.subscribe(client, params, settings, self._now_ms)
        parts = params["partitions"]
        if parts is None:
            parts = list(range(settings.log_partitions))
        committed = self.store.meta.committed(queue, params["group"]) if params["group"] else {}
        start = params["start"]
        if start == "committed" and not params["group"]:
            start = "latest"
        resume = {int(k): v for k, v in (params["offsets"] or {}).items()}
        cursors = {}
        for p in parts:
            plog = self._partition(queue, p, settings)
            lo, hi = plog.log_start_offset, self._visible[(queue, p)]
            if p in resume:  # a consumer picking up where it stood: clamp into the log
                cursors[p] = min(max(resume[p], lo), plog.next_offset)
            elif start == "earliest":
                cursors[p] = lo
            elif start == "latest":
                cursors[p] = hi
            elif start == "committed":
                cursors[p] = min(max(committed.get(p, lo), lo), plog.next_offset)
            elif lo <= start <= plog.next_offset:
                cursors[p] = start
            else:
                raise OffsetOutOfRange(f"start offset {start} is outside {lo}..{plog.next_offset} of {queue}/{p}")
        credit = Credit(params["credit_messages"], params["credit_bytes"])
        sub = Subscription(self.subs.new_id(), client, queue, params["group"], cursors, credit, self._now_ms)
        self.subs.add(sub)
        return {"subscription": sub.id, "partitions": {str(p): off for p, off in cursors.items()}}

    def _ack(self, client: bytes, header: fr.Header, params: AckParams, data: Sequence[Any]) -> dict | None:
        try:
            acked = self.shared.settle(client, params, "ack", self._now_ms)
        finally:
            if params["durable"] and not self.shared.checkpoint(self._now_ms, force=True):
                raise StorageError("the acks are recorded in memory but could not be saved to disk")
        return {"acked": acked}

    def _nack(self, client: bytes, header: fr.Header, params: NackParams, data: Sequence[Any]) -> dict | None:
        return {"nacked": self.shared.settle(client, params, "nack", self._now_ms)}

    def _change_visibility(
        self, client: bytes, header: fr.Header, params: ChangeVisibilityParams, data: Sequence[Any]
    ) -> dict | None:
        return {"changed": self.shared.settle(client, params, "visibility", self._now_ms)}

    def _settle(self, client: bytes, header: fr.Header, params: SettleParams, data: Sequence[Any]) -> dict | None:
        """SETTLE: ack, nack or change the visibility of leases a queue member left behind."""
        if self.replication is not None:
            self.replication.check_coordinator(params["queue"])
        return {"settled": self.shared.settle_left(params, self._now_ms)}

    def _init_producer(
        self, client: bytes, header: fr.Header, params: InitProducerParams, data: Sequence[Any]
    ) -> dict | None:
        if self.cluster_ops is not None:

            def done(result: Any) -> None:
                if isinstance(result, FabricError):
                    self._error(client, header, (), result)
                else:
                    self._reply(client, header, result)

            self.cluster_ops.init_producer(params["name"], done)
            raise Deferred
        producer_id, epoch = self.store.producer_ids.allocate(params["name"])
        return {"producer_id": producer_id, "epoch": epoch}

    def _revoked(self, client: bytes, header: fr.Header, params: RevokedParams, data: Sequence[Any]) -> dict | None:
        return self.streams.revoked(client, params, self._now_ms)

    def _redrive(self, client: bytes, header: fr.Header, params: RedriveParams, data: Sequence[Any]) -> dict | None:
        return self.shared.redrive(params, self._now_ms)

    def _replica_fetch(
        self, client: bytes, header: fr.Header, params: ReplicaFetchParams, data: Sequence[Any]
    ) -> dict | None:
        if self.replication is None:
            raise BadParameter("REPLICA_FETCH is for cluster nodes; this node is not in a cluster")
        self.replication.handle_fetch(client, header, params)  # type: ignore[arg-type]  # Replication: dict params
        raise Deferred

    def _metadata(self, client: bytes, header: fr.Header, params: MetadataParams, data: Sequence[Any]) -> dict | None:
        """The cluster map as this node knows it (a single node: itself, leading everything)."""
        see = None if self.access is None else self.access.may_see(client)
        if self.cluster_ops is not None:
            self.cluster_queues.metadata_waits(client, header, params, data)  # a queue just created
            reply = self.cluster_ops.metadata(params["queues"])
            if see is not None:
                reply = {**reply, "queues": {q: v for q, v in reply["queues"].items() if see(q)}}
            return {**reply, **self._producer_settings(client, params)} if params["settings"] else reply
        names = params["queues"] if params["queues"] is not None else self.store.queue_names()
        if see is not None:
            names = [q for q in names if see(q)]
        queues = {}
        for name in names:
            if self.store.has_queue(name):
                n = self.store.settings(name).log_partitions
                queues[name] = [
                    {
                        "partition": p,
                        "leader": self.config.node_id,
                        "leader_epoch": 0,
                        "replicas": [self.config.node_id],
                        "isr": [self.config.node_id],
                    }
                    for p in range(n)
                ]
        reply = {"cluster": None, "controller": None, "nodes": {self.config.node_id: None}, "queues": queues}
        if params["settings"]:
            reply.update(self._producer_settings(client, params))
        return reply

    def _producer_settings(self, client: bytes, params: MetadataParams) -> dict[str, Any]:
        """METADATA ``settings``: what a producer learns of a queue from DESCRIBE_QUEUE (partitions,
        size limits, priority levels, ordering, mode), for every queue this node holds that the
        client may produce to, in one reply: a producer sending to many queues asks once instead
        of one DESCRIBE_QUEUE round trip per queue. Held queues only (their settings are in the
        store); a queue missing here is described one by one, as before. Paged by name (from
        ``settings_from``, at most ``settings_limit`` queues and SETTINGS_PAGE_BYTES of params:
        the params frame has a 1 MiB ceiling); ``settings_next`` names the next page's first."""
        may = None if self.access is None else self.access.may_produce(client)
        out: dict[str, dict[str, Any]] = {}
        names = self.store.queue_names()
        start, limit = params["settings_from"], params["settings_limit"]
        size = 0
        for i in range(bisect.bisect_left(names, start) if start is not None else 0, len(names)):
            name = names[i]
            if name.startswith(INTERNAL_PREFIX) or (may is not None and not may(name)):
                continue
            size += len(name) + SETTINGS_ENTRY_BYTES
            if len(out) >= limit or size > SETTINGS_PAGE_BYTES:
                return {"settings": out, "settings_next": name}
            s = self.store.settings(name)
            out[name] = {
                "partitions": s.partitions,
                "max_message_bytes": s.max_message_bytes,
                "max_batch_bytes": s.max_batch_bytes,
                "priority_levels": s.priority_levels,
                "ordering": s.ordering,
                "mode": s.mode,
            }
        return {"settings": out, "settings_next": None}

    def append_internal(self, queue: str, p: int, batch: bytearray) -> int:
        """Append a batch the node made itself (dead letters, redrive): same checks and durability as PRODUCE.
        In a cluster only the partition's leader may append (a follower's log is the leader's copy)."""
        if self.replication is not None and self.replication.holds(queue) is not None:
            self.replication.check_leader(queue, p)
        plog = self._partition(queue, p)
        h = check_batch(batch)
        if h.attributes & HAS_TTL:
            self.expiry.saw_ttl(queue)
        base = plog.append(batch, h, now_ms=self._now_ms)
        self.after_append(queue, p, plog, self.store.settings(queue), plog.next_offset, None, None)
        return base

    def after_append(
        self,
        queue: str,
        p: int,
        plog: Any,
        settings: QueueSettings,
        end: int,
        client: bytes | None,
        reply: list[Any] | None,
        *,
        acks_all: bool = False,
    ) -> None:
        """Durability and visibility of an append ending at ``end``: with fsync "always" the reply and
        the consumers wait for the covering fdatasync (on_synced); otherwise both happen now. On a
        replicated partition the replicas come next: consumers see what the in-sync replicas hold,
        and an acks=all reply waits for them (fabric.node.replication)."""
        if settings.fsync == "always":
            gen = self.flusher.request(plog)
            self._pending_sync.append((gen, queue, p, end, client, reply, acks_all))
            return
        if settings.fsync == "interval":
            self.flusher.request_interval(plog, settings.fsync_interval_ms)
        if self.replication is not None and (queue, p) in self.replication.roles:
            self.replication.on_durable(queue, p, end, client, reply, acks_all)
            return
        self._visible[(queue, p)] = end
        self._on_visible(queue, p)
        if self.subs.ready and self.idle():
            self.deliver()
        if client is not None and reply is not None:
            self._send_or_count(client, reply)

    def on_trimmed(self, queue: str, p: int, start: int) -> None:
        """Records below ``start`` left partition ``p`` from the front: groups and readers skip them."""
        if self._visible.get((queue, p), start) < start:
            self._visible[(queue, p)] = start
        for (q, _), group in self.shared.groups.items():
            leases = group.leases.get(p) if q == queue else None
            if leases is not None and leases.floor < start:
                leases.settle(leases.floor, start)
                group.dirty = True
        for sub_id in self.subs.by_partition.get((queue, p), ()):
            sub = self.subs.by_id[sub_id]
            if sub.cursors.get(p, start) < start:
                sub.cursors[p] = start

    def create_queue(self, name: str, settings: QueueSettings) -> None:
        """Create a queue in the store and start tracking what its consumers may see."""
        self.store.create_queue(name, settings, now_ms=self._now_ms)
        for p in range(settings.log_partitions):
            self._visible[(name, p)] = 0

    def _credit(self, client: bytes, header: fr.Header, params: CreditParams, data: Sequence[Any]) -> dict | None:
        sub = self.subs.by_id.get(params["subscription"])
        if sub is None or sub.client != client:
            raise UnknownSubscription(f"no subscription {params['subscription']} for this client")
        self.subs.grant(sub.id, params["messages"], params["bytes"])
        return {}

    def _unsubscribe(
        self, client: bytes, header: fr.Header, params: UnsubscribeParams, data: Sequence[Any]
    ) -> dict | None:
        sub = self.subs.by_id.get(params["subscription"])
        if sub is None or sub.client != client:
            raise UnknownSubscription(f"no subscription {params['subscription']} for this client")
        if params["keep_leases"] and sub.kind != "queue":
            raise BadParameter(f"keep_leases is for a 'queue' subscription; {sub.id} is {sub.kind!r}")
        released = 0
        if params["release"] and sub.shared is not None:
            # given back uncounted and in the same step as the member leaves, so that nothing is
            # pushed to it again in between
            nack = {"subscription": sub.id, "ranges": params["release"], "delay_ms": 0, "uncount": True}
            try:
                released = self.shared.settle(client, nack, "nack", self._now_ms)
            except NotLeaseHolder:
                pass  # expired meanwhile: already given back (counted, as any delivery that timed out)
        self.subs.remove(sub.id, keep_leases=params["keep_leases"])
        return {"released": released}

    # ------------------------------------------------------------------ offsets, sessions

    def _commit(self, client: bytes, header: fr.Header, params: CommitParams, data: Sequence[Any]) -> dict | None:
        queue = params["queue"]
        settings = self.store.settings(queue)
        if params["forget"]:
            return self._forget_group(queue, params["group"], params["offsets"])
        offsets = {int(k): v for k, v in params["offsets"].items()}
        member = self.subs.by_id.get(params["subscription"]) if params["subscription"] else None
        for p, off in offsets.items():
            plog = self._partition(queue, p, settings)
            if (
                member is not None
                and member.kind == "stream"
                and member.group == params["group"]
                and (member.client != client or not self.streams.holds(member, p))
            ):
                raise NotLeaseHolder(f"partition {p} of {queue!r} is not held by this group member")
            if off > plog.next_offset:
                raise OffsetOutOfRange(f"cannot commit {off} past the end {plog.next_offset} of {queue}/{p}")
        self.commit_offsets(queue, params["group"], offsets)
        return {}

    def _forget_group(self, queue: str, group: str, offsets: dict[str, int]) -> dict:
        """COMMIT ``forget``: delete a group, any kind: its committed offsets, its saved state
        (a queue group's leases) and the node's live copy of it, so ``group list`` no longer
        shows it. Refused while it has members, and for a group the queue does not have."""
        if offsets:
            raise BadParameter("COMMIT with forget takes no offsets")
        if self.cluster_ops is not None:
            raise BadParameter("forgetting a group is not supported in a cluster yet")
        members = sum(1 for s in self.subs.by_id.values() if s.group == group and s.queue == queue)
        if members:
            raise BadParameter(f"group {group!r} of {queue!r} has {members} live member(s); stop them first")
        key = (queue, group)
        if (
            key not in self.shared.groups
            and key not in self.streams.groups
            and group not in self.store.meta.groups(queue)
        ):
            raise BadParameter(f"queue {queue!r} has no group {group!r}")
        self.shared.forget_group(queue, group)
        self.streams.forget_group(queue, group)
        self.store.meta.delete_group(queue, group)
        return {}

    def commit_offsets(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        """Store a group's commit; in a cluster, the other nodes learn it too."""
        self.store.meta.commit(queue, group, offsets)
        if self.cluster_ops is not None:
            self.cluster_ops.group_committed(queue, group, offsets)

    def _committed(self, client: bytes, header: fr.Header, params: CommittedParams, data: Sequence[Any]) -> dict | None:
        self.store.settings(params["queue"])
        offsets = self.store.meta.committed(params["queue"], params["group"])
        return {"offsets": {str(p): off for p, off in offsets.items()}}

    def _heartbeat(self, client: bytes, header: fr.Header, params: HeartbeatParams, data: Sequence[Any]) -> dict | None:
        if self.streams.groups:
            self.streams.heartbeat(client, self._now_ms)
        return {"subscriptions": sorted(s.id for s in self.subs.of_client(client))}

    def _expire_sessions(self, now_ms: int) -> None:
        """Forget clients silent longer than their session timeout: the longest their subscriptions
        asked for (each within the node's bounds), or the node's for a client with none."""
        default = self.config.limits.session_timeout_ms
        for client, seen in list(self._seen.items()):
            timeout = max((s.session_timeout_ms or default for s in self.subs.of_client(client)), default=default)
            if now_ms - seen <= timeout:
                continue
            del self._seen[client]
            for sub in self.subs.remove_client(client):
                where = f"group {sub.group!r} on {sub.queue!r}" if sub.group else f"queue {sub.queue!r}"
                held = f"partitions {sorted(sub.cursors)}" if sub.kind == "stream" else "its leases and keys"
                log.info(
                    "session expired: %s member %d (%s) silent %d ms (timeout %d ms); %s go to the others",
                    where,
                    sub.id,
                    sub.kind,
                    now_ms - seen,
                    timeout,
                    held,
                )

    def end_revoked(self, revoked: Sequence[tuple[bytes, str]]) -> None:
        """These connections' principals were revoked (``AccessGuard.maybe_reload``): their
        subscriptions end now, as an expired session's do (leases back to the group, group
        membership over, partitions rebalanced), and each gets a PUSH event with status
        NOT_AUTHORIZED saying so: nothing is pushed to them after it."""
        for client, principal in revoked:
            self._seen.pop(client, None)
            for sub in self.subs.remove_client(client):
                exc = NotAuthorized(
                    f"principal {principal!r} was revoked: subscription {sub.id} on {sub.queue!r} ended"
                )
                log.info("%s (its leases and partitions go to the others)", exc.message)
                event = fr.Header(Op.PUSH, sub.id, fr.FLAG_EVENT, exc.code)
                self._send_or_count(client, fr.encode(event, {"error": exc.name, "message": exc.message}))

    # ------------------------------------------------------------------ admin

    def enable_access(self, access: Any) -> None:
        """Authentication is on: check every request, with the ACLs stored in the metadata."""
        from fabric.security.acl import Rule

        self.access = access
        for raw in self.store.meta.acls() if self.config.cluster is None else ():  # a cluster's: etcd
            try:
                access.acl.add(Rule.from_json(raw))
            except (FabricError, KeyError, TypeError):
                log.warning("ignoring an unreadable ACL rule: %r", raw)

    def _quota_set(self, client: bytes, header: fr.Header, params: QuotaSetParams, data: Sequence[Any]) -> dict | None:
        q = Quota.checked(params["target"], params["messages_per_s"], params["bytes_per_s"], params["burst_ms"])
        if self.cluster_ops is not None:
            cluster_policy.set_quota(self, client, header, q)  # etcd: raises Deferred
        self.quotas.set(q, self._now_ms)
        stored = [x for x in self.store.meta.quotas() if x.get("target") != q.target]
        self.store.meta.put_quotas([*stored, q.to_json()])  # 0/0 stored too: it overrides the config's
        log.info("quota %s: %d msg/s, %d B/s (burst %d ms)", q.target, q.messages_per_s, q.bytes_per_s, q.burst_ms)
        return {"quota": q.to_json()}

    def _quota_list(self, client: bytes, header: fr.Header, params: NoParams, data: Sequence[Any]) -> dict | None:
        return {
            "quotas": [q.to_json() for q in self.quotas.quotas.values()],
            "throttled_ms": dict(self.quotas.throttled_ms),
            "refused": dict(self.quotas.refused),
        }

    def _acl_list(self, client: bytes, header: fr.Header, params: AclListParams, data: Sequence[Any]) -> dict | None:
        if self.access is None:
            raise BadParameter("authentication is off on this node ([security] keys_dir): there are no ACLs")
        rules = [r.to_json() for r in self.access.acl.rules]
        if params["principal"] is not None:
            rules = [r for r in rules if r["principal"] == params["principal"]]
        return {"rules": rules, "admins": sorted(self.access.admins)}

    def _acl_change(
        self, client: bytes, header: fr.Header, params: AclChangeParams, data: Sequence[Any]
    ) -> dict | None:
        from fabric.security.acl import Rule

        if self.access is None:
            raise BadParameter("authentication is off on this node ([security] keys_dir): there are no ACLs")
        rule = Rule.checked(params["principal"], params["operation"], params["resource"])
        if self.cluster_ops is not None:
            cluster_policy.change_acl(self, client, header, rule, header.op == Op.ACL_ADD)  # etcd: Deferred
        acl = self.access.acl
        changed = acl.add(rule) if header.op == Op.ACL_ADD else acl.remove(rule)
        if changed:
            self.store.meta.put_acls([r.to_json() for r in acl.rules])
            log.info("ACL %s: %s", "added" if header.op == Op.ACL_ADD else "removed", rule.to_json())
        return {"changed": changed, "rules": len(acl.rules)}

    def _cluster_status(self, client: bytes, header: fr.Header, params: NoParams, data: Sequence[Any]) -> dict | None:
        from fabric.node.cluster_status import answer

        answer(self, client, header)  # a cluster node reads etcd first: raises Deferred
        return None

    def _ping(self, client: bytes, header: fr.Header, params: PingParams, data: Sequence[Any]) -> dict | None:
        return {
            "node": self.config.node_id,
            "version": __version__,
            "time_ms": self._now_ms,
            "queues": len(self.store.queue_names()),
            "stats": dict(self.stats),
        }

    def _create_queue(
        self, client: bytes, header: fr.Header, params: CreateQueueParams, data: Sequence[Any]
    ) -> dict | None:
        name = params["name"]
        if name.startswith(INTERNAL_PREFIX):
            raise BadParameter(f"queue {name!r}: names starting with '__' are reserved for the node's own queues")
        base = self.config.queues.get(name, self.config.queue_defaults)
        settings = QueueSettings.from_dict(params["settings"], base=base, where=f"queue {name!r} settings")
        if self.cluster_ops is not None:
            self.cluster_queues.queue_op(client, header, params, settings)
        if params["if_not_exists"] and name in self.store.queue_names():
            return self._describe(name)
        self.create_queue(name, settings)
        log.info("queue %r created: %d partition(s), fsync %s", name, settings.partitions, settings.fsync)
        return self._describe(name)

    def _delete_queue(
        self, client: bytes, header: fr.Header, params: DeleteQueueParams, data: Sequence[Any]
    ) -> dict | None:
        name = params["name"]
        if self.cluster_ops is not None:
            self.cluster_queues.queue_op(client, header, params, None)
        if params["if_exists"] and name not in self.store.queue_names():
            return {"deleted": False}
        self.drop_queue(name)
        return {"deleted": True}

    def _alter_queue(
        self, client: bytes, header: fr.Header, params: AlterQueueParams, data: Sequence[Any]
    ) -> dict | None:
        """ALTER_QUEUE: add partitions (a cluster: through the controller, which places them), or
        change settings that may change live (a single node)."""
        name, partitions, changes = params["name"], params["partitions"], params["settings"]
        if name.startswith(INTERNAL_PREFIX):
            raise BadParameter(f"queue {name!r}: the node's own queues are not altered")
        if (partitions is None) == (changes is None):
            raise BadParameter("ALTER_QUEUE takes either 'partitions' or 'settings'")
        if partitions is None:
            if self.cluster_ops is not None:
                self.cluster_queues.alter_settings_op(client, header, params, changes or {})
            return self._alter_settings(name, changes or {})
        before = self.store.settings(name).partitions if self.store.has_queue(name) else None
        if self.cluster_ops is not None:
            self.cluster_queues.alter_op(client, header, params, partitions)
        self.store.settings(name)  # UNKNOWN_QUEUE
        self.grow_queue(name, partitions)
        log.info("queue %r altered: %d -> %d partition(s)", name, before, partitions)
        return {"name": name, "partitions": partitions, "added": partitions - (before or partitions)}

    def _alter_settings(self, name: str, changes: dict[str, Any]) -> dict:
        before = self.store.settings(name).to_dict()
        after = self.store.alter_settings(name, changes).to_dict()
        changed = {k: [before[k], after[k]] for k in sorted(changes) if before[k] != after[k]}
        log.info("queue %r altered: %s", name, ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items()))
        return {"name": name, "settings": after, "changed": changed}

    def grow_queue(self, name: str, partitions: int) -> None:
        """Grow ``name`` to ``partitions`` partitions (store first) and give the new ones to what
        reads the queue: stream groups rebalance over them, queue groups and subscriptions that
        read every partition take them in, every group known for the queue starts them at 0 (a
        message sent to a new partition before a consumer is assigned it is not skipped)."""
        old = self.store.settings(name).log_partitions
        settings = self.store.add_partitions(name, partitions, self._now_ms)
        if settings.log_partitions == old:
            return
        new = list(range(old, settings.log_partitions))
        for p in new:
            self._visible[(name, p)] = self.store.partition(name, p).next_offset
        for group in self.store.meta.groups(name):
            committed = self.store.meta.committed(name, group)
            if committed:
                self.store.meta.commit(name, group, {p: 0 for p in new if p not in committed})
        self.streams.grow(name, settings.log_partitions)
        self.shared.grow(name, settings, new)
        for sub in [s for s in self.subs.by_id.values() if s.queue == name and s.kind != "stream"]:
            if len(sub.cursors) >= old and set(range(old)) <= set(sub.cursors):
                for p in new:
                    self.subs.assign(sub, p, 0)
        for sub in [s for s in self.subs.by_id.values() if s.queue == name and s.kind == "stream" and not s.group]:
            if set(range(old)) <= set(sub.cursors):
                for p in new:
                    self.subs.assign(sub, p, 0)
        self.deliver()

    def drop_queue(self, name: str, *, moved: bool = False) -> None:
        """Delete a queue with its data and forget everything the node tracks for it. ``moved``:
        the queue lives on, on other nodes (its replicas moved off this one): delayed messages
        this node took stay in its delay store and go to the partition's leader when due."""
        self.store.settings(name)
        self.subs.remove_queue(name)
        self.shared.forget_queue(name)
        self.streams.forget_queue(name)
        if not moved:
            self.timers.forget_queue(name)
        self.dedup.forget_queue(name)
        self.expiry.forget_queue(name)
        self.ordering.forget_queue(name)
        parked = [x for x in self._parked if x[3]["queue"] == name]
        self._parked = [x for x in self._parked if x[3]["queue"] != name]
        self.store.delete_queue(name)
        for key in [k for k in self._visible if k[0] == name]:
            del self._visible[key]
        for _, c, h, prm in parked:
            self._answer_fetch(c, h, prm, final=True)
        log.info("queue %r deleted with its data", name)

    def _list_queues(
        self, client: bytes, header: fr.Header, params: ListQueuesParams, data: Sequence[Any]
    ) -> dict | None:
        """LIST_QUEUES, one page by name (``from``, ``limit``, ``prefix``; ``next`` names the next
        page's first), so its params stay under the frame's 1 MiB ceiling however many queues
        there are. Of the other queues only the names are sorted; the page's own are summed up.
        A cluster node also lists the queues of the map it holds no replica of, in name order."""
        names = self.store.queue_names()
        mapped: dict[str, Any] = {}
        if self.cluster_ops is not None:
            mapped = self.cluster_ops.metadata(None)["queues"]
            names = sorted(set(names).union(mapped))
        if self.access is not None and (see := self.access.may_see(client)) is not None:
            names = [q for q in names if see(q)]  # the queues it has no right on are not there for it
        page, after = list_page(names, params["from"], params["prefix"], params["limit"])
        out = []
        for name in page:
            if self.store.has_queue(name):
                out.append(queue_summary(self, name))
            else:
                out.append({"name": name, "partitions": len(mapped[name]), "messages": None, "size_bytes": None})
        return {"queues": out, "next": after}

    def _describe_queue(
        self, client: bytes, header: fr.Header, params: DescribeQueueParams, data: Sequence[Any]
    ) -> dict | None:
        name = params["name"]
        if self.replication is not None and not self.store.has_queue(name):
            self.cluster_queues.describe_elsewhere(client, header, params, data)
        if (
            self.replication is not None
            and self.store.settings(name).mode == "direct"
            and not header.flags & fr.FLAG_FORWARDED
        ):
            # a direct queue's consumers register with its coordinator: the registry is there
            leader = self.replication.leader_lookup(name, 0)
            if leader is not None and leader != self.config.node_id:
                self.replication.pass_on(client, header, params, data, leader, name)  # type: ignore[arg-type]  # Replication: dict params
        created = params["auto_create"] and not self.store.has_queue(name) and self._auto_create(name)
        d = self._describe(name)
        return {**d, "created": True} if created else d

    def _describe(self, name: str) -> dict[str, Any]:
        return describe_queue(self, name)

    def _purge(self, client: bytes, header: fr.Header, params: PurgeParams, data: Sequence[Any]) -> dict | None:
        """PURGE: the partition's log starts at its high watermark (at the leader; a cluster's
        followers follow the leader's log start)."""
        if self.replication is not None:
            self.replication.route(client, header, params, data)  # type: ignore[arg-type]  # Replication: dict params
        return purge_partition(self, params["queue"], params["partition"])

    def _list_offsets(
        self, client: bytes, header: fr.Header, params: ListOffsetsParams, data: Sequence[Any]
    ) -> dict | None:
        if self.replication is not None:
            self.replication.route(client, header, params, data)  # type: ignore[arg-type]  # Replication: dict params
        queue, p, at = params["queue"], params["partition"], params["at"]
        plog = self._partition(queue, p)
        upto = self._visible[(queue, p)]
        if at == "earliest":
            offset = plog.log_start_offset
        elif at == "latest":
            offset = upto
        else:
            offset = min(plog.offset_for_timestamp(at), upto)
        return {"offset": offset, "log_start_offset": plog.log_start_offset, "high_watermark": upto}


def _coordinated(params: SubscribeParams) -> bool:
    """A subscription whose group state one node must hold: queue and key_shared groups, and
    stream groups whose partitions the group assigns."""
    if params["kind"] != "stream":
        return True
    return bool(params["group"]) and params["partitions"] is None and params["offsets"] is None
