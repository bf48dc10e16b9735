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

import logging
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING, Any

from fabric.errors import (
    BadParameter,
    ConfigError,
    DiskFull,
    FabricError,
    InternalError,
    NotAuthorized,
    OffsetOutOfRange,
    ProducerFenced,
    ProtocolError,
    QueueMoved,
    RequestTooLarge,
    StorageError,
    UnknownPartition,
    UnknownQueue,
)
from fabric.histogram import LATENCY_BUCKETS, Histogram
from fabric.node import admin, offsets, purge, subscribing
from fabric.node.autoexpand import AutoExpand
from fabric.node.autoshrink import AutoShrink
from fabric.node.dedup import QueueDedup
from fabric.node.delayed import DelayedDelivery
from fabric.node.expiry import Expiry
from fabric.node.heap import Heap
from fabric.node.idle_poll import IdlePoll
from fabric.node.notices import Notices
from fabric.node.ordering import StrictOrdering
from fabric.node.partition import NodePartition
from fabric.node.placement import Placement, PlacementFactory, SingleNode
from fabric.node.produce import produce
from fabric.node.purgatory import Deferred, Purgatory, SyncWait
from fabric.node.quotas import Quota, Quotas
from fabric.node.replication import Replication
from fabric.node.retention import RetentionRounds
from fabric.node.shared import DLQ_SUFFIX, SharedGroups
from fabric.node.streams import StreamGroups
from fabric.node.subscribing import mode_mismatch
from fabric.node.usage import UsageRecorder
from fabric.protocol import frames as fr
from fabric.protocol.admission import NODE, ParamsCache, admit_header, error_reply
from fabric.protocol.batch import HAS_TTL, batch_record_count, check_batch, whole_prefix
from fabric.protocol.ops import INTERNAL_PREFIX, Op
from fabric.protocol.requests import (
    AckParams,
    ChangeVisibilityParams,
    FetchParams,
    HeartbeatParams,
    InitProducerParams,
    NackParams,
    ProduceParams,
    RedriveParams,
    ReplicaFetchParams,
    RevokedParams,
)
from fabric.push.subscriptions import Pusher, Subscriptions
from fabric.settings import NodeConfig, QueueSettings
from fabric.store.flusher import Flusher
from fabric.store.store import Store

if TYPE_CHECKING:
    from fabric.node.access import AccessGuard
    from fabric.node.cluster_member import ClusterMember
    from fabric.store.log import PartitionLog

log = logging.getLogger("fabric.broker")
TIMED_OPS = (Op.PRODUCE, Op.FETCH, Op.COMMIT, Op.ACK, Op.SUBSCRIBE, Op.DESCRIBE_QUEUE)  # request-time histograms
PUSH_HEADER = fr.HEADER.pack(fr.MAGIC, fr.VERSION, Op.PUSH, fr.FLAG_EVENT, 0, 0, 0)[:8]

SendFn = Callable[[bytes, list[Any]], bool]  # (client, frames) -> False if the client is gone
# a request's handler; its params are the op's fabric.protocol.requests type (Any here: one per op)
Handler = Callable[[bytes, fr.Header, Any, Sequence[Any]], dict[str, Any] | None]
TICK_MS = 100
SESSION_CHECK_MS = 200  # consumers may ask for session timeouts down to [limits] min_session_timeout_ms
PRODUCER_SAVE_MS = 10_000  # how often partitions that rolled a segment snapshot their producer state


class Broker:
    def __init__(
        self,
        config: NodeConfig,
        store: Store,
        flusher: Flusher,
        send: SendFn,
        *,
        now_ms: int,
        placement: PlacementFactory = SingleNode,
    ) -> None:
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
        self.delayed = DelayedDelivery(self)
        self.dedup = QueueDedup(self)
        self.expiry = Expiry(self)
        self.ordering = StrictOrdering(self)
        self.partitions: dict[tuple[str, int], NodePartition] = {}  # every partition log the store holds
        self._pending_sync: deque[SyncWait] = deque()  # appends waiting for their fdatasync, in order
        self.fetches: Purgatory[tuple[str, int], tuple[bytes, fr.Header, FetchParams]] = Purgatory()  # long polls
        self.unreadable: dict[tuple[str, int], StorageError] = {}  # push reads refused this turn
        self._seen: dict[bytes, int] = {}
        self._params_cache: ParamsCache = {}  # validated params by their bytes (fabric.protocol.admission)
        self.access: AccessGuard | None = None  # when [security] keys_dir is set
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
        self.retention = RetentionRounds(store, now_ms)
        self._next_producer_save = now_ms + PRODUCER_SAVE_MS
        self.stats = {"requests": 0, "errors": 0, "batches_in": 0, "records_in": 0, "dropped_replies": 0}
        # metrics (fabric.node.metrics reads them at scrape time): per request, never per message
        self.op_counts = [0] * 256
        self.error_counts: dict[str, int] = {}
        self.queue_in: dict[str, list[int]] = {}  # queue -> [messages, bytes] stored by PRODUCE
        self.latency = {int(op): Histogram(LATENCY_BUCKETS) for op in TIMED_OPS}
        self.usage = UsageRecorder(self, config.usage_interval_ms, now_ms)  # ticks on a single node only
        self.notices = Notices(log)  # rate-limited operator lines: dead letters, full disk, fencing
        self.heap: Heap | None = None  # the collector's pauses, set by the server (fabric.node.heap)
        self.idle_poll: IdlePoll | None = None  # the loop's busy-polling, set by the server (its metrics)
        self.auto_expand = AutoExpand(self)  # queues with auto_partitions_max grow under load
        self.auto_shrink = AutoShrink(self)  # ... and shrink back when their load stays low
        self._handlers: dict[int, Handler] = {
            Op.PING: partial(admin.ping, self),
            Op.HEARTBEAT: self._heartbeat,
            Op.PRODUCE: self._produce,
            Op.FETCH: self._fetch,
            Op.SUBSCRIBE: partial(subscribing.subscribe, self),
            Op.CREDIT: partial(subscribing.credit, self),
            Op.UNSUBSCRIBE: partial(subscribing.unsubscribe, self),
            Op.COMMIT: partial(offsets.commit, self),
            Op.COMMITTED: partial(offsets.committed, self),
            Op.CREATE_QUEUE: partial(admin.create_queue, self),
            Op.DELETE_QUEUE: partial(admin.delete_queue, self),
            Op.ALTER_QUEUE: partial(admin.alter_queue, self),
            Op.LIST_QUEUES: partial(admin.list_queues, self),
            Op.DESCRIBE_QUEUE: partial(admin.describe_queue_op, self),
            Op.LIST_OFFSETS: partial(offsets.list_offsets, self),
            Op.ACK: self._ack,
            Op.NACK: self._nack,
            Op.CHANGE_VISIBILITY: self._change_visibility,
            Op.REDRIVE: self._redrive,
            Op.REVOKED: self._revoked,
            Op.INIT_PRODUCER: self._init_producer,
            Op.REPLICA_FETCH: self._replica_fetch,
            Op.METADATA: partial(admin.metadata, self),
            Op.QUOTA_SET: partial(admin.quota_set, self),
            Op.QUOTA_LIST: partial(admin.quota_list, self),
            Op.ACL_LIST: partial(admin.acl_list, self),
            Op.ACL_ADD: partial(admin.acl_change, self),
            Op.ACL_REMOVE: partial(admin.acl_change, self),
            Op.CLUSTER_STATUS: partial(admin.cluster_status, self),
            Op.PURGE: partial(purge.purge_op, self),
            Op.SETTLE: partial(subscribing.settle, self),
        }
        for name in store.queue_names():
            self._open_partitions(name, 0, store.settings(name).log_partitions, visible_at_end=True)
        # where requests are served: this node alone, or the cluster map (fabric.node.placement)
        self.placement: Placement = placement(self)
        self.replication: Replication | None = self.placement.replication  # a cluster node's replicas
        self.cluster_ops: ClusterMember | None = self.placement.cluster_ops  # a cluster node's etcd side

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
                and params is not None
                and self.placement.park_unknown(client, frames, params)
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
        while self._pending_sync and self._pending_sync[0].generation <= generation:
            part, upto, client, reply, acks_all = self._pending_sync.popleft()[1:]
            queue, p = part.queue, part.partition
            if self.partitions.get((queue, p)) is part:  # not a queue deleted (or made again) meanwhile
                if self.placement.replicate(queue, p, upto, client, reply, acks_all):
                    continue
                if part.advance_to(upto):
                    self._on_visible(queue, p)
            if client is not None and reply is not None:
                replies.append((client, reply))
        self.deliver()
        for client, reply in replies:
            self._send_or_count(client, reply)
        if self.delayed.moving:
            self.delayed.on_synced(generation)

    def on_sync_failed(self, generation: int) -> None:
        """fdatasync failed: writes up to ``generation`` may not be durable. Tell their producers;
        the data stays invisible to consumers (the log refuses appends until reopened)."""
        while self._pending_sync and self._pending_sync[0].generation <= generation:
            wait = self._pending_sync.popleft()
            if wait.client is not None and wait.reply is not None:
                where = f"{wait.partition.queue}/{wait.partition.partition}"
                exc = StorageError(f"fsync failed on {where}: the write is not durable")
                self._error(wait.client, fr.decode_header(wait.reply[0]), (), exc)
        if self.delayed.moving:
            self.delayed.on_sync_failed(generation)

    def tick(self, now_ms: int) -> None:
        self._now_ms = now_ms
        self.placement.tick(now_ms)
        if self.fetches:
            for client, header, params in self.fetches.expire(now_ms):
                self._answer_fetch(client, header, params, final=True)
        if now_ms >= self._next_session_check:
            self._next_session_check = now_ms + SESSION_CHECK_MS
            self._expire_sessions(now_ms)
        self.auto_expand.tick(now_ms)
        self.auto_shrink.tick(now_ms)
        if self.shared.groups:
            self.shared.tick(now_ms)
            if self.expiry.ttl_queues:
                self.expiry.tick(now_ms)
        self.delayed.tick(now_ms)
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
        if self.placement.usage_here:  # a cluster's usage records come with its front end (issue 10/12)
            self.usage.tick(now_ms)
        if now_ms >= self.retention.next_ms:
            self._skip_trimmed(self.retention.tick(now_ms))

    def _skip_trimmed(self, names: list[str]) -> None:
        """Retention looked at ``names``: their subscriptions move past what it deleted."""
        store = self.store
        for name in names:
            if not store.has_queue(name):
                continue
            for p, plog in enumerate(store.partitions(name)):
                part = self.partitions.get((name, p))
                subs = self.subs.by_partition.get((name, p))
                if part is None or not subs:
                    continue
                upto = part.visible
                start = plog.log_start_offset
                for sub_id in subs:
                    sub = self.subs.by_id[sub_id]
                    sub.cursors[p] = max(sub.cursors[p], min(start, upto))

    def deliver(self) -> None:
        if self.subs.ready:
            self.pusher.deliver(self._now_ms)
        if self.unreadable:
            subscribing.end_unreadable(self)

    def next_timeout_ms(self, now_ms: int) -> int:
        if self.subs.ready:
            return 0  # more to push: the loop comes straight back
        deadline = min(self._next_session_check, now_ms + TICK_MS)
        if self.fetches and (due := self.fetches.next_deadline_ms()) is not None:
            deadline = min(deadline, due)
        for group_deadline in (
            self.shared.next_deadline_ms() if self.shared.groups else None,
            self.streams.next_deadline_ms() if self.streams.groups else None,
            self.delayed.next_due_ms(),
            self.ordering.next_due_ms() if self.ordering.held else None,
        ):
            if group_deadline is not None:
                deadline = min(deadline, group_deadline)
        if (due := self.placement.next_due_ms()) is not None:
            deadline = min(deadline, due)
        return max(0, deadline - now_ms)

    def close(self) -> None:
        if self.placement.usage_here and self.usage.interval_ms:
            self.usage.flush(self._now_ms)  # before the flusher's last sync
        self.shared.checkpoint(self._now_ms, force=True)
        for client, header, params in self.fetches.drain():
            self._answer_fetch(client, header, params, final=True)
        self.delayed.close()

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
        self.placement.route(client, header, params, data)
        created = not self.store.has_queue(params["queue"]) and self.auto_create(params["queue"])
        if not created:
            settings = self.store.settings(params["queue"])
            if settings.mode == "direct":
                raise mode_mismatch(params["queue"], "direct", "send with a fabric Producer")
            at = params.get("move_copy")
            if at is None and settings.sealed:
                raise QueueMoved(f"queue {params['queue']!r} is sealed: it is moving to another cluster; retry")
            if at is not None and at != self._partition(params["queue"], params["partition"]).next_offset:
                raise OffsetOutOfRange(
                    f"{params['queue']}/{params['partition']}: the move's copy expected its log to end at {at}"
                )
        throttle_ms = 0
        if self.quotas.active:
            principal = self.access.principals.get(client, "anonymous") if self.access is not None else "anonymous"
            messages = sum(batch_record_count(b) for b in data)
            throttle_ms = self.quotas.charge(principal, params["queue"], messages, sum(map(len, data)), self._now_ms)
        reply = produce(self, client, header, params, data, created=created, throttle_ms=throttle_ms)
        return {**reply, "created": True} if created and reply is not None else reply

    def auto_create(self, name: str) -> bool:
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

    def _partition(self, queue: str, p: int, settings: QueueSettings | None = None) -> PartitionLog:
        settings = settings or self.store.settings(queue)
        if p >= settings.log_partitions:
            raise UnknownPartition(f"queue {queue!r} has partitions 0..{settings.log_partitions - 1}, not {p}")
        return self.store.partition(queue, p)

    def _on_visible(self, queue: str, p: int) -> None:
        self.subs.on_data(queue, p)
        if self.fetches:
            for client, header, params in self.fetches.wake((queue, p)):
                self._answer_fetch(client, header, params, final=True)

    # ------------------------------------------------------------------ fetch and push

    def _read_visible(self, queue: str, p: int, offset: int, max_bytes: int) -> tuple[bytes, int]:
        part = self.partitions.get((queue, p))
        upto = part.visible if part is not None else 0
        if offset >= upto:
            return b"", upto
        return self.store.partition(queue, p).read(offset, max_bytes), upto

    def _read_pushed(self, queue: str, p: int, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """The pusher's read: a partition that cannot be read (an encrypted one whose key id the
        key file lacks, a disk error) pushes nothing, says so in the log, and its subscriptions
        end with the error after this delivery pass (``subscribing.end_unreadable``); FETCH gets
        the error."""
        try:
            return self._read_visible(queue, p, offset, max_bytes)
        except StorageError as exc:
            self.unreadable[(queue, p)] = exc
            self.notices.note(
                self._now_ms,
                ("unreadable", queue, str(p)),
                1,
                f"{queue}/{p}: {{n}} push read(s) refused: {exc.message}",
                logging.ERROR,
            )
            return b"", self.visible(queue, p, 0)

    def _fetch(self, client: bytes, header: fr.Header, params: FetchParams, data: Sequence[Any]) -> dict | None:
        self.placement.route(client, header, params, data)
        plog = self._partition(params["queue"], params["partition"])
        offset = params["offset"]
        if offset < plog.log_start_offset or offset > plog.next_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside {plog.log_start_offset}..{plog.next_offset} "
                f"of {params['queue']}/{params['partition']}"
            )
        if not self._answer_fetch(client, header, params, final=params["wait_ms"] == 0):
            key = (params["queue"], params["partition"])
            self.fetches.park(key, self._now_ms + params["wait_ms"], (client, header, params))
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

    def _init_producer(
        self, client: bytes, header: fr.Header, params: InitProducerParams, data: Sequence[Any]
    ) -> dict | None:
        return self.placement.init_producer(client, header, params["name"])

    def _revoked(self, client: bytes, header: fr.Header, params: RevokedParams, data: Sequence[Any]) -> dict | None:
        return self.streams.revoked(client, params, self._now_ms)

    def _redrive(self, client: bytes, header: fr.Header, params: RedriveParams, data: Sequence[Any]) -> dict | None:
        return self.shared.redrive(params, self._now_ms)

    def _replica_fetch(
        self, client: bytes, header: fr.Header, params: ReplicaFetchParams, data: Sequence[Any]
    ) -> dict | None:
        self.placement.replica_fetch(client, header, params)
        raise Deferred

    def append_internal(self, queue: str, p: int, batch: bytearray) -> int:
        """Append a batch the node made itself (dead letters, redrive): same checks and durability as PRODUCE.
        In a cluster only the partition's leader may append (a follower's log is the leader's copy)."""
        self.placement.check_internal_append(queue, p)
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
        plog: PartitionLog,
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
            self._pending_sync.append(SyncWait(gen, self.partitions[(queue, p)], end, client, reply, acks_all))
            return
        if settings.fsync == "interval":
            self.flusher.request_interval(plog, settings.fsync_interval_ms)
        if self.placement.replicate(queue, p, end, client, reply, acks_all):
            return
        self.partitions[(queue, p)].advance(end)
        self._on_visible(queue, p)
        if self.subs.ready and self.idle():
            self.deliver()
        if client is not None and reply is not None:
            self._send_or_count(client, reply)

    def on_trimmed(self, queue: str, p: int, start: int) -> None:
        """Records below ``start`` left partition ``p`` from the front: groups and readers skip them."""
        part = self.partitions.get((queue, p))
        if part is not None:
            part.advance_to(start)
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
        self._open_partitions(name, 0, settings.log_partitions)

    def _open_partitions(self, name: str, first: int, end: int, *, visible_at_end: bool = False) -> None:
        """Track logs ``first``..``end - 1`` of queue ``name``: what consumers may see of each starts
        at 0 (a new log), or at its end (a log the store had when the node started)."""
        for p in range(first, end):
            plog = self.store.partition(name, p)
            self.partitions[(name, p)] = NodePartition(name, p, plog, plog.next_offset if visible_at_end else 0)

    def visible(self, queue: str, p: int, default: int) -> int:
        """What consumers may see of ``queue/p`` (``default`` for a partition the node does not hold)."""
        part = self.partitions.get((queue, p))
        return part.visible if part is not None else default

    # ------------------------------------------------------------------ offsets, sessions

    def commit_offsets(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        """Store a group's commit; in a cluster, the other nodes learn it too."""
        self.store.meta.commit(queue, group, offsets)
        self.placement.group_committed(queue, group, offsets)

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

    def enable_access(self, access: AccessGuard) -> None:
        """Authentication is on: check every request, with the ACLs stored in the metadata."""
        from fabric.security.acl import Rule

        self.access = access
        for raw in self.store.meta.acls() if self.config.cluster is None else ():  # a cluster's: etcd
            try:
                access.acl.add(Rule.from_json(raw))
            except (FabricError, KeyError, TypeError):
                log.warning("ignoring an unreadable ACL rule: %r", raw)

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
        self._open_partitions(name, old, settings.log_partitions, visible_at_end=True)
        for group in self.store.meta.groups(name):
            committed = self.store.meta.committed(name, group)
            if committed:
                # on a single node nothing committed a new partition yet: a value there is one that
                # shrinking left behind when it removed a partition of that number (stale: 0 too)
                stale = self.config.cluster is None
                self.store.meta.commit(name, group, {p: 0 for p in new if stale or p not in committed})
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
            self.delayed.forget_queue(name)
        self.dedup.forget_queue(name)
        self.expiry.forget_queue(name)
        closed = [key for key in self.partitions if key[0] == name]
        parked = [fetch for key in closed for fetch in self.fetches.wake(key)]
        self.store.delete_queue(name)
        for key in closed:
            del self.partitions[key]
        for c, h, prm in parked:
            self._answer_fetch(c, h, prm, final=True)  # UNKNOWN_QUEUE now
        log.info("queue %r deleted with its data", name)
