"""The node process: a ZeroMQ ROUTER front end around the broker, one event loop.

One thread owns the ROUTER socket, the store and every subscription (the seeds'
lock-free serialisation: a partition has a single writer). Group commit runs on
this thread at the end of each turn of the loop (``_sync_inline``: one fdatasync
per log written since the last turn) when at most ``INLINE_SYNC_MAX_LOGS`` logs
and ``INLINE_SYNC_MAX_BYTES`` wait; otherwise a second thread, the store's flusher, calls fdatasync and
reports each finished generation through an inproc PAIR socket that the loop
polls beside the ROUTER (fabric/store/flusher.py, "Inline rounds").
"""

from __future__ import annotations

import logging
import os
import queue as queue_mod
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

import zmq

from fabric import allocator
from fabric.errors import ConfigError
from fabric.foreground import serve_until_signalled
from fabric.node.broker import Broker
from fabric.node.heap import Heap
from fabric.node.idle_poll import IdlePoll
from fabric.node.placement import PlacementFactory, SingleNode
from fabric.protocol.frames import FLAG_ROUTED, ROUTED_CLIENT, routed_client, split_routed, unrouted
from fabric.settings import NodeConfig, check_exposure
from fabric.store.flusher import Flusher
from fabric.store.store import Store
from fabric.transport.front_door import authenticated_recv, bind_front_door
from fabric.transport.stream_server import StreamListener, is_stream_client
from fabric.transport.wakeup import drain, wake_pair

if TYPE_CHECKING:
    from fabric.node.cluster_placement import ClusterPlacement

log = logging.getLogger("fabric.server")
_GEN = struct.Struct("<q")
RECV_BURST = 512
# Group commit on the loop's own thread when at most this many logs, with at most this many bytes
# between them, wait for an fdatasync (no thread hand-offs: lower latency); larger rounds go to
# the flusher thread, whose fdatasyncs overlap the loop's work (fabric/store/flusher.py, "Inline
# rounds").
INLINE_SYNC_MAX_LOGS = 2
INLINE_SYNC_MAX_BYTES = 64 * 1024
NOBLOCK = int(zmq.NOBLOCK)
COPY_BELOW = 64 * 1024
POLL_MS_MAX = 100


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Server:
    """A single fabric node: every role in one process."""

    def __init__(self, config: NodeConfig) -> None:
        allocator.tune()
        self.config = config
        check_exposure(config, f"node {config.node_id}", [config.listen, config.stream_listen])
        if config.security.keys_dir and config.stream_listen:
            from fabric.security.certs import require_tls

            require_tls(config.security.keys_dir)  # TLS on the stream transport needs the certificates
        self._internal: tuple[bytes, bytes] | None = None  # the key pair this node connects to peers with
        if config.security.keys_dir and config.cluster is not None:
            from fabric.security.keys import internal_pair

            self._internal = internal_pair(config.security.keys_dir)
        at_rest = None
        if config.security.at_rest_key_file:  # a missing, unsafe or malformed key file: ConfigError, no start
            from fabric.security.at_rest import AtRestKeys

            at_rest = AtRestKeys(config.security.at_rest_key_file)
        self._stop = threading.Event()
        self.ctx = zmq.Context(io_threads=1)
        self.access: Any = None
        if config.security.keys_dir:
            from fabric.node.access import AccessGuard
            from fabric.security.acl import Acl

            self.access = AccessGuard(self.ctx, config.security, Acl())
        try:
            # requests between the configured limit and twice it get REQUEST_TOO_LARGE from the broker
            self.sock, self.endpoint = bind_front_door(
                self.ctx,
                config.listen,
                max_message_bytes=2 * config.limits.max_request_bytes,
                linger_ms=1000,
                secure=None if self.access is None else self.access.secure,
            )
        except ConfigError:
            if self.access is not None:
                self.access.close()
            self.ctx.destroy(linger=0)
            raise
        self._wake_rx, self._wake_tx = wake_pair(self.ctx, f"fabric-flusher-{id(self)}")  # tx: the flusher's
        started = time.monotonic()
        self.store = Store(
            Path(config.data_dir),
            defaults=config.queue_defaults,
            now_ms=now_ms(),
            tail_cache_bytes=config.limits.tail_cache_bytes,
            at_rest=at_rest,
        )
        self.startup_ms = int((time.monotonic() - started) * 1000)
        self.flusher = Flusher(
            self._on_synced,
            on_error=self._on_sync_failed,
            inline_max_logs=INLINE_SYNC_MAX_LOGS,
            inline_max_bytes=INLINE_SYNC_MAX_BYTES,
        )
        self._consumed_generation = 0  # newest generation taken from the flusher thread's reports
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self._wake_rx, zmq.POLLIN)
        self.stream: StreamListener | None = None
        if config.stream_listen:
            try:
                self.stream = StreamListener(
                    config.stream_listen,
                    self.poller,
                    max_message_bytes=2 * config.limits.max_request_bytes,
                    auth=self.access,  # with authentication on: TLS with client certificates
                )
            except ConfigError:
                if self.access is not None:
                    self.access.close()
                self.store.close(clean=True)
                self.ctx.destroy(linger=0)
                raise
        self.stream_endpoint = self.stream.endpoint if self.stream is not None else ""
        self.cluster: Any = None  # fabric.node.cluster_member.ClusterMember on a cluster node
        self.peers: Any = None  # fabric.transport.peers.Peers on a cluster node
        self.placement: ClusterPlacement | None = None  # a cluster node's (the broker's placement)
        placement: PlacementFactory = SingleNode if config.cluster is None else self._start_cluster(config)
        self.broker = Broker(config, self.store, self.flusher, self._send, now_ms=now_ms(), placement=placement)
        self.broker.endpoint = self.endpoint
        self.idle_poll = self.broker.idle_poll = IdlePoll(config.idle_poll_us)
        self.heap = self.broker.heap = Heap()
        if self.access is not None:
            self.broker.enable_access(self.access)
        # The broker pushes to consumers before it replies when no other request waits (lower
        # latency when idle, fewer pushes when busy). The loop reads one message ahead to know.
        self._more = False
        self.broker.idle = lambda: not self._more
        if config.cluster is None:
            for name, settings in config.queues.items():
                if name not in self.store.queue_names():
                    self.broker.create_queue(name, settings)
        # work other threads hand to the event loop (a metrics scrape): run between requests
        self._loop_calls: queue_mod.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = (
            queue_mod.SimpleQueue()
        )
        # a byte written here wakes the loop for them (os.write may come from any thread)
        self._calls_rx, self._calls_tx = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.poller.register(self._calls_rx, zmq.POLLIN)
        self.metrics: Any = None
        self.metrics_endpoint = ""
        if config.metrics_listen:
            self._start_metrics(config.metrics_listen)

    def _start_metrics(self, listen: str) -> None:
        from fabric.metrics_http import MetricsServer
        from fabric.node.metrics import NodeCollector, sliced_snapshot

        try:
            ask = lambda: sliced_snapshot(self.broker, self.on_loop)  # noqa: E731
            self.metrics = MetricsServer(listen, NodeCollector(ask))
        except ConfigError:
            self.store.close(clean=True)
            self.ctx.destroy(linger=0)
            raise
        self.metrics_endpoint = self.metrics.endpoint

    def on_loop(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        """Run ``fn`` on the event loop's thread (from any other thread); its result, or None if
        the loop did not get to it within ``timeout_s`` (at most one poll interval when idle)."""
        box: list[Any] = []
        done = threading.Event()
        self._loop_calls.put((fn, box, done))
        try:
            os.write(self._calls_tx, b"\0")
        except OSError:  # full (the loop is behind: it runs them anyway) or closed (stopping)
            pass
        return box[0] if done.wait(timeout_s) and box else None

    def _run_loop_calls(self) -> None:
        while True:
            try:
                fn, box, done = self._loop_calls.get_nowait()
            except queue_mod.Empty:
                return
            try:
                box.append(fn())
            except Exception:
                log.exception("a call on the event loop failed")
            done.set()

    def _start_cluster(self, config: NodeConfig) -> PlacementFactory:
        """A cluster node: the cluster thread (etcd) and DEALERs to the peers; the placement
        the broker is built with, which holds the replication roles."""
        from fabric.node.cluster_member import ClusterMember
        from fabric.node.cluster_placement import ClusterPlacement
        from fabric.node.replication import Replication
        from fabric.node.throttle import TokenBucket
        from fabric.transport.peers import Peers

        assert config.cluster is not None
        self._cluster_rx, cluster_tx = wake_pair(self.ctx, f"fabric-cluster-{id(self)}")  # tx: the cluster thread's
        self.poller.register(self._cluster_rx, zmq.POLLIN)
        curve = None if self._internal is None else (*self._internal, self.access.keys.public)
        self.cluster = ClusterMember(
            config.node_id,
            self.endpoint,
            config.cluster,
            lambda: cluster_tx.send(b"", zmq.NOBLOCK),
            curve=curve,
            load=self._load_counters,
        )
        self.peers = Peers(self.ctx, self.poller, identity=config.node_id.encode(), curve=curve)
        cluster = config.cluster
        catch_up = (
            TokenBucket(cluster.move_throttle_bytes_per_s, now_ms=now_ms())
            if cluster.move_throttle_bytes_per_s
            else None
        )

        def placement(broker: Broker) -> ClusterPlacement:
            replication = Replication(
                broker,
                config.node_id,
                self.peers.send,
                self.cluster.propose_isr,
                min_insync=cluster.min_insync_replicas,
                lag_time_ms=cluster.replica_lag_time_ms,
                leader_lookup=self._leader_of,
                replicas_lookup=self._replicas,
                catch_up=catch_up,
            )
            self.peers.on_link = replication.on_link
            self.placement = ClusterPlacement(broker, self.cluster, replication)
            return self.placement

        return placement

    def _load_counters(self) -> Any:
        """The store's load counters, copied on the loop; None if the loop did not get to it within
        0.2 s (the cluster thread that asks also keeps the node's lease alive: it must not wait long)."""
        from fabric.node.metrics import load_counters

        return self.on_loop(lambda: load_counters(self.broker), 0.2)

    def _leader_of(self, queue: str, p: int) -> str | None:
        parts = self.cluster.metadata([queue])["queues"].get(queue) or []
        return next((x["leader"] for x in parts if x["partition"] == p), None)

    def _replicas(self, queue: str) -> list[list[str]] | None:
        parts = self.cluster.metadata([queue])["queues"].get(queue)
        return None if not parts else [list(x["replicas"]) for x in sorted(parts, key=lambda x: x["partition"])]

    def _drain_cluster(self) -> None:
        """Apply what the cluster thread learnt, in order, on the loop's thread."""
        drain(self._cluster_rx)
        placement = self.placement
        assert placement is not None
        repl = placement.repl
        while True:
            try:
                ev = self.cluster.events.get_nowait()
            except Exception:
                return
            now = now_ms()
            try:
                if ev.kind == "role":
                    queue, p, record, settings, is_leader = ev.args
                    moved = record is not None and self.config.node_id not in record.replicas
                    if moved:
                        record = None  # moved off this node (fabric cluster rebalance / drain)
                    if record is None:
                        repl.forget(queue, p)
                        if self.store.has_queue(queue) and not any(k[0] == queue for k in repl.roles):
                            self.broker.drop_queue(queue, moved=moved)
                        continue
                    if not self.store.has_queue(queue):
                        from fabric.settings import QueueSettings

                        self.broker.create_queue(queue, QueueSettings.from_dict(settings))
                        log.info("queue %r placed on this node", queue)
                    elif p >= self.store.settings(queue).log_partitions:
                        self.broker.grow_queue(queue, int(settings["partitions"]))  # fabric queue alter
                        log.info("queue %r grown to %d partitions", queue, settings["partitions"])
                    repl.apply(queue, p, record, now, may_lead=is_leader)
                    if p == 0 and record.leader != self.config.node_id:
                        placement.queues.resign_coordination(queue)
                elif ev.kind == "nodes":
                    (nodes,) = ev.args
                    for gone in set(repl.endpoints) - set(nodes):
                        repl.on_leader_moved("", -1, gone)
                    repl.endpoints = dict(nodes)
                    self.peers.update({k: v for k, v in nodes.items() if k != self.config.node_id})
                elif ev.kind == "leader":  # a partition this node does not hold moved
                    repl.on_leader_moved(*ev.args)
                    if ev.args[1] == 0:
                        placement.queues.resign_coordination(ev.args[0])
                elif ev.kind == "grow":  # partitions added to a queue held here (fabric queue alter)
                    queue, partitions = ev.args
                    if self.store.has_queue(queue) and self.store.settings(queue).partitions < partitions:
                        self.broker.grow_queue(queue, partitions)
                elif ev.kind == "settings":  # settings changed live (fabric queue alter --set)
                    queue, changed = ev.args
                    if self.store.has_queue(queue):
                        self.store.alter_settings(queue, changed)
                        log.info("queue %r settings changed: %s", queue, ", ".join(sorted(changed)))
                elif ev.kind == "groupstate":
                    placement.queues.merge_group_state(*ev.args)
                elif ev.kind == "group":
                    placement.queues.merge_offsets(*ev.args)
                elif ev.kind == "policy":  # the cluster's ACLs and quotas (etcd)
                    from fabric.node.cluster_policy import apply

                    apply(self.broker, *ev.args)
                elif ev.kind == "isr":
                    repl.on_isr_result(*ev.args)
                elif ev.kind == "done":
                    done, result = ev.args
                    done(result)
            except Exception:
                log.exception("applying a cluster event failed: %s", ev.kind)

    # -- called from the flusher thread: only touches its own PAIR socket
    def _on_synced(self, generation: int) -> None:
        self._wake_tx.send(_GEN.pack(generation))

    def _on_sync_failed(self, generation: int, exc: BaseException) -> None:
        log.error("fdatasync failed for writes up to generation %d: %s", generation, exc)
        self._wake_tx.send(_GEN.pack(-generation))

    def _send(self, client: bytes, frames: list[Any]) -> bool:
        if self.stream is not None and is_stream_client(client):
            return self.stream.send(client, frames)
        if client[:2] == ROUTED_CLIENT and len(client) > 6:
            return self._send_routed(client, frames)
        # Zero-copy only pays for large frames (a push chunk); small replies are copied.
        copy = len(frames) < 3 or len(frames[2]) < COPY_BELOW
        try:
            self.sock.send_multipart([client, *frames], NOBLOCK, copy=copy)
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the client is gone; EAGAIN: it stopped reading
            log.debug("could not send to client %s: %s", client.hex(), exc)
            return False

    def _send_routed(self, client: bytes, frames: list[Any]) -> bool:
        """To a client behind a router: ``[router, header | ROUTED, client, params, data...]``."""
        parts = split_routed(client)
        if parts is None:
            return False
        header = bytearray(frames[0])
        header[4] |= FLAG_ROUTED
        copy = len(frames) < 3 or len(frames[2]) < COPY_BELOW
        try:
            self.sock.send_multipart([parts[0], bytes(header), parts[1], *frames[1:]], NOBLOCK, copy=copy)
            return True
        except zmq.ZMQError as exc:
            log.debug("could not send to client %s via router %s: %s", parts[1].hex(), parts[0].hex(), exc)
            return False

    def _unwrap(self, frames: list[bytes]) -> list[bytes] | None:
        """A routed message as the broker takes it; the client's principal remembered when the
        router's connection is authenticated as the cluster's internal identity. From any other
        connection: NOT_AUTHORIZED to its sender (None). A broken envelope goes to the broker as
        it came (PROTOCOL_ERROR)."""
        got = unwrap_routed(frames)
        if got is None:
            return frames
        if self.access is not None and not self.access.trust_routed(frames[0], got[0][0], got[1]):
            self.broker._error(frames[0], None, frames[1:], self.access.routed_refusal(frames[0]))
            return None
        return got[0]

    def _drain_wake(self) -> None:
        """Generations reported by the flusher: g > 0 synced, -g failed (in order)."""
        while True:
            try:
                g = _GEN.unpack(self._wake_rx.recv(NOBLOCK))[0]
            except zmq.Again:
                return
            self._consumed_generation = abs(g)
            if g > 0:
                self.broker.on_synced(g)
            else:
                self.broker.on_sync_failed(-g)

    def _sync_inline(self) -> None:
        """Group commit on the loop's own thread (the flusher's "inline rounds"): one fdatasync
        per log written since the last one, then the pushes and replies it releases. Requests
        that arrive meanwhile wait in the sockets and share the next fdatasync."""
        result = self.flusher.sync_pending(self._consumed_generation)
        if result is None:  # nothing to do here: the flusher thread has the round
            return
        generation, failure = result
        if failure is None:
            self.broker.on_synced(generation)
        else:
            log.error("fdatasync failed for writes up to generation %d: %s", generation, failure)
            self.broker.on_sync_failed(generation)

    def stop(self) -> None:
        self._stop.set()

    def _idle_wait(self, timeout_ms: int) -> dict[Any, int]:
        """Out of work: poll for up to the idle-poll budget while that pays, yielding the CPU
        between looks, then sleep in the poller (fabric.node.idle_poll)."""
        poller, idle = self.poller, self.idle_poll
        started = perf_counter()
        events: dict[Any, int] = {}
        spin = idle.spin_s()
        if spin:
            until = started + spin
            while True:
                events = dict(poller.poll(0))
                if events or perf_counter() >= until:
                    break
                os.sched_yield()
        if not events:
            events = dict(poller.poll(timeout_ms))
        idle.idle_ended(perf_counter() - started)
        return events

    def serve_forever(self) -> None:
        heap = self.heap
        heap.start(self.store.shape())
        next_heap = 0
        self.flusher.start()
        if self.cluster is not None:
            self.cluster.start()
        poller, stream = self.poller, self.stream
        broker, sock, wake, flusher, calls = self.broker, self.sock, self._wake_rx, self.flusher, self._calls_rx
        recv = (
            sock.recv_multipart
            if self.access is None
            else authenticated_recv(sock, self.access.principals, self.access.learn)  # principals remembered
        )

        def from_stream(client: bytes, frames: list[bytes], more: bool) -> None:
            self._more = more
            broker.handle(client, frames, now_ms())
            self._more = False

        idle = self.idle_poll
        try:
            while not self._stop.is_set():
                timeout = min(broker.next_timeout_ms(now_ms()), POLL_MS_MAX)
                events = self._idle_wait(timeout) if timeout and idle.budget_s else dict(poller.poll(timeout))
                if sock in events:
                    try:
                        frames = recv(NOBLOCK)
                    except zmq.Again:
                        frames = None
                    for i in range(RECV_BURST):
                        if frames is None:
                            break
                        nxt = None
                        if i + 1 < RECV_BURST:
                            try:
                                nxt = recv(NOBLOCK)
                            except zmq.Again:
                                pass
                        self._more = nxt is not None
                        if len(frames) >= 2:
                            if len(frames[1]) == 16 and frames[1][4] & FLAG_ROUTED and frames[1][:2] == b"FB":
                                frames = self._unwrap(frames)  # None: refused (not a router)
                            if frames is not None:
                                broker.handle(frames[0], frames[1:], now_ms())
                        frames = nxt
                    self._more = False
                if stream is not None and len(events) > (sock in events) + (wake in events) + (calls in events):
                    stream.on_events(events, from_stream)
                if wake in events:
                    self._drain_wake()
                if self.cluster is not None:
                    if self._cluster_rx in events:
                        self._drain_cluster()
                    if broker.replication is not None:
                        self.peers.receive(events, broker.replication.on_peer_reply)
                now = now_ms()
                broker.tick(now)
                broker.deliver()
                if now >= next_heap:
                    next_heap = now + 1000
                    heap.tick(now, self.store.shape())
                if self.access is not None:
                    revoked = self.access.maybe_reload()
                    if revoked:
                        broker.end_revoked(revoked)
                    if stream is not None and stream.pending:
                        stream.expire_handshakes(time.monotonic())
                if calls in events:
                    try:
                        os.read(calls, 4096)
                    except OSError:
                        pass
                if not self._loop_calls.empty():
                    self._run_loop_calls()
                if flusher.pending:
                    self._sync_inline()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        log.info("stopping: syncing and closing the store")
        self.heap.stop()
        if self.access is not None:
            self.access.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster.join(5)
            self.peers.close()
            if self.broker.replication is not None:
                self.broker.replication.save()
        try:
            self.broker.close()
            self.flusher.stop()  # performs a final sync of what was requested
            self._drain_wake()  # replies for writes that the final sync covered
            self.store.close(clean=True)
        finally:
            if self.stream is not None:
                self.stream.close()
            self.ctx.destroy(linger=500)
            tx, self._calls_tx = self._calls_tx, -1  # a late on_loop writes to nothing, not a reused fd
            os.close(tx)
            os.close(self._calls_rx)


def unwrap_routed(frames: list[bytes]) -> tuple[list[bytes], str] | None:
    """``[router, header | ROUTED, client, principal, params, data...]`` from a router's DEALER
    becomes ``([routed identity, header, params, data...], principal)``: the broker sees a client
    like any other, and replies and pushes to that identity go back through the router
    (``_send_routed``). None when the envelope is broken (a router never sends that): the broker
    then answers the sender PROTOCOL_ERROR for the flag it does not know."""
    if not 0 < len(frames[0]) < 256:
        return None
    parts = unrouted(frames[1:])
    if parts is None:
        return None
    header, client, principal, rest = parts
    return [routed_client(frames[0], client), header, *rest], principal


def raise_open_files_limit() -> None:
    """A node holds one open file per partition (its active segment) besides its sockets: take the
    hard limit on open files as the soft one (often 1024 against 2^20), so thousands of queues
    do not meet EMFILE."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, hard, exc)


def run(config: NodeConfig, *, on_ready: Any = None) -> None:
    """Run a node in the foreground until SIGINT or SIGTERM."""
    raise_open_files_limit()
    server = Server(config)
    serve_until_signalled(server, on_ready)
