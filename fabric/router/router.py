"""The router process: a ROUTER front end for clients, one DEALER per storage node behind it.

Theory of operation
-------------------
A router is stateless in everything that matters: it keeps no data and no offsets, only the
cluster map (followed from etcd by :class:`~fabric.router.map_follower.MapFollower`) and, per
client, which nodes it talked to and which node granted each of its subscriptions. Kill it and
clients move to another router (they are given every router's endpoint); what was in flight
through it gets no reply and is retried by the client, which the idempotent producer makes safe.

Nothing a router forwards is forgotten (:mod:`fabric.router.inflight`): it remembers each request
it sent on until the node answers, and when the link to that node is lost (the connection closed,
or ZeroMQ's heartbeats unanswered for ``LINK_TIMEOUT_MS``: a paused or cut-off store) or the map
moves a partition's leadership away from it, it answers those requests itself, at once, with the
retriable NOT_LEADER; the client refreshes its map and resends. A fanned-out HEARTBEAT stops
waiting for a node whose link is lost.

The request path, per message: read the 16-byte header (and refuse what a client may not send),
parse the params (cached by their bytes: a producer sends the same params for every batch to a
partition), pick the node (:func:`~fabric.router.routing.target`), and send the message on to
it unchanged but for the envelope: ``[header | FLAG_ROUTED, client id, principal, params,
data...]``. Record
batches are never decoded or copied into new frames. The node answers, and pushes, with the same
envelope; the router strips it and sends ``[client id, header, params, data...]`` to the client.
The node sees every client behind a router as a client of its own (its identity is the router's
connection plus the client's id), so sessions, subscriptions, credit and pushes work unchanged.

What the router reads of a reply: the op and status in the header; the params only of a
SUBSCRIBE reply (to remember the subscription's node), of a HEARTBEAT reply (merged over the
client's nodes) and of a NOT_COORDINATOR refusal (the node names a coordinator endpoint the
client must not connect to directly: the router drops it and the client retries through the
router, which by then routes by the new map).

This is also where the front-end duties of the seeds belong (authentication, authorization, rate
limits, usage records: issue 12): ``_from_client`` is the one place every client request passes.
What a request must be to pass is :mod:`fabric.protocol.admission`'s rule, the node's own with
the ``ROUTER`` door (a router also refuses what only nodes send each other), and a refusal is
the same error reply a node would give.

Authentication (``[security] keys_dir``): the front ROUTER is a CurveZMQ server with the
deployment's key pair and the same ZAP handler as a node's (``fabric/security/zap.py``): a client
connects only with an allowed key, its key file's name is its principal, and a revoked client's
open connection is refused NOT_AUTHORIZED at its next request. The router sends the principal
on in the envelope, over DEALERs authenticated as the cluster's internal identity
(``keys_dir/internal.key_secret``); the store trusts that principal only from such a connection
and applies its ACLs and quotas to it, so authorization stays where the data is.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from fabric import allocator
from fabric.errors import (
    ClusterUnavailable,
    ConfigError,
    FabricError,
    InternalError,
    NotAuthorized,
    NotCoordinator,
    NotLeader,
    Throttled,
)
from fabric.federation.front_door import QUEUE_PARAM, FrontDoor
from fabric.foreground import serve_until_signalled
from fabric.protocol import frames as fr
from fabric.protocol.admission import ROUTER, ParamsCache, admit, error_reply
from fabric.protocol.ops import Op
from fabric.router.inflight import InFlight, Key, Pending
from fabric.router.map_follower import MapFollower
from fabric.router.routing import (
    FANOUT,
    PARTITION_OPS,
    ClientState,
    RouteMap,
    merge_heartbeats,
    target,
)
from fabric.security.keys import INTERNAL
from fabric.settings import ClusterConfig, SecurityConfig
from fabric.transport.endpoints import ipv6
from fabric.transport.front_door import authenticated_recv, bind_front_door
from fabric.transport.peers import use_curve
from fabric.transport.wakeup import drain, wake_pair

log = logging.getLogger("fabric.router")
NOBLOCK = int(zmq.NOBLOCK)
RECV_BURST = 512
COPY_BELOW = 64 * 1024  # smaller frames are copied: cheaper than zero-copy bookkeeping
HEARTBEAT_WAIT_S = 2.0  # a node that does not answer a fanned-out HEARTBEAT by then is left out
# A store's link is judged dead when ZeroMQ's heartbeats get no answer for LINK_TIMEOUT_MS (a
# paused, hung or cut-off process: one killed resets its connection at once). ZeroMQ's I/O
# threads answer them, not the store's loop, so a store busy with a long fsync is not "dead".
LINK_HEARTBEAT_MS = 250
LINK_TIMEOUT_MS = 1000
ABANDONED_MAX = 100_000  # requests refused on a client's behalf whose late replies are dropped
CLIENT_IDLE_S = 600.0  # what the router remembers of a client silent this long is forgotten
MAX_REQUEST_BYTES = 64 * 1024 * 1024 + 1024 * 1024  # ceiling per message (the nodes check their own limit)
_STATUS = struct.Struct("<H")
_NOT_LEADER, _NOT_COORDINATOR = NotLeader.code, NotCoordinator.code


@dataclass
class _Fanout:
    """A HEARTBEAT sent to several nodes: the replies so far and who has not answered."""

    header: bytes
    waiting: set[str]
    replies: list[dict[str, Any]] = field(default_factory=list)
    deadline: float = 0.0


class Router:
    """One router: ``serve_forever()`` until ``stop()``."""

    def __init__(
        self,
        name: str,
        listen: str,
        cluster: ClusterConfig,
        *,
        metrics_listen: str = "",
        security: SecurityConfig | None = None,
    ) -> None:
        self.name = name
        allocator.tune()
        self._stop = threading.Event()
        internal = None
        if security is not None and security.keys_dir:
            from fabric.security.keys import internal_pair

            internal = internal_pair(security.keys_dir)  # ConfigError (what to run) before anything opens
        self.ctx = zmq.Context(io_threads=1)
        self.keys: Any = None  # fabric.security.zap.ClientKeys with authentication on
        self.principals: dict[bytes, str] = {}  # client -> its principal (authentication on)
        self._backend_curve: tuple[bytes, bytes, bytes] | None = None
        if security is not None and internal is not None:
            from fabric.security.zap import ClientKeys

            try:
                self.keys = ClientKeys(self.ctx, security.keys_dir)
            except ConfigError:
                self.ctx.destroy(linger=0)
                raise
            self._backend_curve = (*internal, self.keys.public)
        try:
            self.front, self.endpoint = bind_front_door(
                self.ctx,
                listen,
                max_message_bytes=MAX_REQUEST_BYTES,
                linger_ms=0,
                secure=None if self.keys is None else self.keys.secure,
            )
        except ConfigError as exc:
            if self.keys is not None:
                self.keys.close()
            self.ctx.destroy(linger=0)
            raise ConfigError(f"router {name}: {exc.message}") from None
        self._wake_rx, wake_tx = wake_pair(self.ctx, f"fabric-router-map-{id(self)}")  # tx: the map thread's
        self.follower = MapFollower(name, self.endpoint, cluster, lambda: wake_tx.send(b"", NOBLOCK))
        self.poller = zmq.Poller()
        self.poller.register(self.front, zmq.POLLIN)
        self.poller.register(self._wake_rx, zmq.POLLIN)
        self.rmap = RouteMap()
        self.cluster_name = cluster.name
        # a federated cluster's router that saw a live store and sees none now answers CLUSTER_UNAVAILABLE
        # (a client goes on with the federation's other clusters); any other router NOT_LEADER, which
        # clients wait out (a whole cluster restarting under them)
        self._had_stores = False
        # a federated cluster's router: queues of other clusters are answered QUEUE_ELSEWHERE
        self.front_door: FrontDoor | None = self.follower.front_door
        self.backends: dict[str, tuple[str, zmq.Socket]] = {}  # node -> (endpoint, DEALER)
        self._by_socket: dict[zmq.Socket, str] = {}
        self._monitors: dict[zmq.Socket, str] = {}  # a backend's monitor socket -> its node
        self.inflight = InFlight()
        self._abandoned: dict[Key, None] = {}  # refused on the client's behalf (insertion-ordered, bounded)
        self._now = time.monotonic()
        self.clients: dict[bytes, ClientState] = {}
        self._params: ParamsCache = {}  # validated, by op and params bytes
        self._subscribing: dict[tuple[bytes, int], tuple[str, str]] = {}  # (client, rid) -> (node, queue)
        self._fanouts: dict[tuple[bytes, int], _Fanout] = {}
        self._next_sweep = 0.0
        self.stats = {
            "requests": 0,
            "replies": 0,
            "refused": 0,
            "unroutable": 0,
            "not_authorized": 0,
            "failed_over": 0,  # forwarded, then refused on the client's behalf (link lost, leader moved)
            "links_lost": 0,
            "redirected": 0,  # answered QUEUE_ELSEWHERE (or a share here not created yet): the front door
        }
        self.forwarded: dict[str, int] = {}  # node -> requests sent on to it
        self.metrics: Any = None
        self.metrics_endpoint = ""
        if metrics_listen:
            from fabric.metrics_http import MetricsServer
            from fabric.router.metrics import RouterCollector

            try:
                self.metrics = MetricsServer(metrics_listen, RouterCollector(self))
            except ConfigError:
                if self.keys is not None:
                    self.keys.close()
                self.ctx.destroy(linger=0)
                raise
            self.metrics_endpoint = self.metrics.endpoint

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ the loop

    def serve_forever(self) -> None:
        self.follower.start()
        front, wake = self.front, self._wake_rx
        recv = front.recv_multipart if self.keys is None else authenticated_recv(front, self.principals, self._learn)
        try:
            while not self._stop.is_set():
                events = dict(self.poller.poll(100))
                if wake in events:
                    self._drain_wake()
                if front in events:
                    for _ in range(RECV_BURST):
                        try:
                            frames = recv(NOBLOCK)
                        except zmq.Again:
                            break
                        try:
                            self._from_client(frames)
                        except Exception:  # one bad message never takes the router down
                            log.exception("router %s: a client message failed", self.name)
                            self._refuse(frames[0], frames[1:], None, InternalError("the router failed this request"))
                for mon, node in list(self._monitors.items()):
                    if mon in events:
                        self._link_events(mon, node)
                for sock, node in list(self._by_socket.items()):
                    if sock in events:
                        for _ in range(RECV_BURST):
                            try:
                                frames = sock.recv_multipart(NOBLOCK)
                            except zmq.Again:
                                break
                            try:
                                self._from_node(node, frames)
                            except Exception:
                                log.exception("router %s: a message from %s failed", self.name, node)
                now = self._now = time.monotonic()
                if self._fanouts:
                    self._expire_fanouts(now)
                if now >= self._next_sweep:
                    self._sweep(now)
                if self.keys is not None:
                    self.keys.maybe_reload()
        finally:
            self.close()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        self.follower.stop()
        self.follower.join(5)
        if self.keys is not None:
            self.keys.close()
        self.ctx.destroy(linger=0)

    def _drain_wake(self) -> None:
        drain(self._wake_rx)
        self.front_door = self.follower.front_door
        rmap = self.follower.route_map
        if rmap is self.rmap:
            return
        self.rmap = rmap
        self._had_stores = self._had_stores or bool(rmap.nodes)
        if self.inflight.size:
            for node, key, pending in self.inflight.moved(rmap.leader):
                self._fail(key, pending, f"router {self.name}: {node} no longer leads {pending.partition}; retry")
        for node, endpoint in rmap.nodes.items():
            have = self.backends.get(node)
            if have is not None and have[0] == endpoint:
                continue
            if have is not None:
                self._close_backend(node)
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IPV6, ipv6(endpoint))  # a store at tcp://[::1]:PORT
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 100_000)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # a node not connected (yet) refuses at once
            sock.setsockopt(zmq.RECONNECT_IVL, 100)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            sock.setsockopt(zmq.HEARTBEAT_IVL, LINK_HEARTBEAT_MS)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, LINK_TIMEOUT_MS)
            sock.setsockopt(zmq.HEARTBEAT_TTL, 3 * LINK_TIMEOUT_MS)
            if self._backend_curve is not None:
                use_curve(sock, self._backend_curve)  # the stores know a router by the internal identity
            mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            sock.connect(endpoint)
            self.backends[node] = (endpoint, sock)
            self._by_socket[sock] = node
            self._monitors[mon] = node
            self.poller.register(sock, zmq.POLLIN)
            self.poller.register(mon, zmq.POLLIN)
            log.info("router %s: storage node %s at %s", self.name, node, endpoint)
        for node in [n for n in self.backends if n not in rmap.nodes]:
            log.info("router %s: storage node %s is gone", self.name, node)
            self._close_backend(node)

    def _close_backend(self, node: str) -> None:
        _, sock = self.backends.pop(node)
        self._by_socket.pop(sock, None)
        for mon in [m for m, n in self._monitors.items() if n == node]:
            del self._monitors[mon]
            self.poller.unregister(mon)
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            mon.close(linger=0)
        self.poller.unregister(sock)
        sock.close(linger=0)
        self._link_lost(node, "left the cluster map")

    def _link_events(self, mon: zmq.Socket, node: str) -> None:
        """Read a backend's monitor: a DISCONNECTED link fails what was in flight there."""
        lost = False
        while True:
            try:
                mon.recv_multipart(NOBLOCK)  # [event id + value, endpoint]: only DISCONNECTED is asked for
            except zmq.Again:
                break
            lost = True
        if lost:
            self.stats["links_lost"] += 1
            self.follower.refresh()
            self._link_lost(node, "lost its link")

    def _link_lost(self, node: str, why: str) -> None:
        """Every request in flight to ``node`` is refused, retriably, on its client's behalf, and
        no fanned-out HEARTBEAT waits for it any more."""
        for key, pending in self.inflight.lost(node):
            self._fail(key, pending, f"router {self.name}: node {node} {why} with this request in flight; retry")
        for fkey in [k for k, f in self._fanouts.items() if node in f.waiting]:
            fan = self._fanouts[fkey]
            fan.waiting.discard(node)
            if not fan.waiting:
                self._finish_fanout(*fkey)

    def _fail(self, key: Key, pending: Pending, message: str) -> None:
        """Refuse a forwarded request as NOT_LEADER (the client refreshes its map and resends, which
        the idempotent producer makes safe); the node's reply, should one still come, is dropped."""
        self.stats["failed_over"] += 1
        if len(self._abandoned) >= ABANDONED_MAX:
            del self._abandoned[next(iter(self._abandoned))]
        self._abandoned[key] = None
        client, _ = key
        self._refuse(client, [], fr.decode_header(pending.header), NotLeader(message))

    # ------------------------------------------------------------------ client -> node

    def _learn(self, client: bytes, first: zmq.Frame) -> None:
        """A new connection's principal, from its first message's first frame (``User-Id``)."""
        self.principals[client] = self.keys.principal_of(first)

    def _from_client(self, frames: list[bytes]) -> None:
        client = frames[0]
        msg = frames[1:]
        self.stats["requests"] += 1
        principal = ""
        try:
            if self.keys is not None:
                principal = self._authenticated(client)
            header, op, params = admit(msg, ROUTER, self._params)  # fabric.protocol.admission
        except FabricError as exc:
            self._refuse(client, msg, None, exc)
            return
        state = self.clients.get(client)
        if state is None:
            state = self.clients[client] = ClientState()
        state.last_seen = time.monotonic()
        door = self.front_door
        if door is not None and op in QUEUE_PARAM:
            elsewhere = door.refusal(op, params, self.rmap.replicas)  # fabric/federation/front_door.py
            if elsewhere is not None:
                self.stats["redirected"] += 1
                self._refuse(client, msg, header, elsewhere)
                return
        node = target(op, params, client, state, self.rmap)
        if node == FANOUT:
            self._heartbeat(client, header, state, principal)
            return
        if node is None or node not in self.backends:
            self.stats["unroutable"] += 1
            self.follower.refresh()
            if not self.rmap.nodes and self._had_stores and self.front_door is not None:
                down = ClusterUnavailable(
                    f"cluster {self.cluster_name} has no live store (router {self.name}); retry later"
                )
                self._refuse(client, msg, header, down)
                return
            self._refuse(
                client,
                msg,
                header,
                NotLeader(f"router {self.name} of cluster {self.cluster_name}: no storage node is reachable; retry"),
            )
            return
        wants_reply = not header.flags & fr.FLAG_NO_REPLY
        if wants_reply and self.inflight.full():
            self._refuse(client, msg, header, Throttled(f"router {self.name}: too many requests in flight; retry"))
            return
        try:
            copy = len(msg) < 3 or len(msg[2]) < COPY_BELOW
            self.backends[node][1].send_multipart(fr.routed(msg[0], client, principal, msg[1:]), NOBLOCK, copy=copy)
        except zmq.ZMQError:
            self.stats["unroutable"] += 1
            self._refuse(
                client,
                msg,
                header,
                NotLeader(f"router {self.name} of cluster {self.cluster_name}: node {node} is not reachable; retry"),
            )
            return
        if wants_reply:
            partition = None
            if op in PARTITION_OPS and self.rmap.leader(params["queue"], params["partition"]) == node:
                partition = (params["queue"], params["partition"])
            self.inflight.sent(node, (client, header.request_id), msg[0], partition, self._now)
        state.nodes.add(node)
        self.forwarded[node] = self.forwarded.get(node, 0) + 1
        if op == Op.SUBSCRIBE:
            self._subscribing[(client, header.request_id)] = (node, params["queue"])

    def _authenticated(self, client: bytes) -> str:
        """The client's principal, while its key is allowed (a revoked one: NOT_AUTHORIZED)."""
        principal = self.principals.get(client, "")
        if principal not in self.keys.allowed or principal == INTERNAL:
            self.stats["not_authorized"] += 1
            why = (
                "its key is not allowed (revoked?)"
                if principal != INTERNAL
                else "the internal identity is not a client"
            )
            raise NotAuthorized(f"principal {principal or '(unknown)'!r} may not connect 'router {self.name}': {why}")
        return principal

    def _refuse(self, client: bytes, msg: list[bytes], header: fr.Header | None, exc: FabricError) -> None:
        self.stats["refused"] += 1
        reply = error_reply(header, msg, exc)
        if reply is not None:
            self._to_client(client, reply)

    def _to_client(self, client: bytes, frames: list[Any]) -> None:
        try:
            copy = len(frames) < 3 or len(frames[2]) < COPY_BELOW
            self.front.send_multipart([client, *frames], NOBLOCK, copy=copy)
            self.stats["replies"] += 1
        except zmq.ZMQError:  # the client is gone (EHOSTUNREACH) or not reading (EAGAIN)
            pass

    # ------------------------------------------------------------------ node -> client

    def _from_node(self, node: str, frames: list[bytes]) -> None:
        if len(frames) < 3 or len(frames[0]) != fr.HEADER_SIZE or not frames[0][4] & fr.FLAG_ROUTED:
            log.warning("router %s: dropped a message from %s without a routed envelope", self.name, node)
            return
        header = bytearray(frames[0])
        header[4] &= ~fr.FLAG_ROUTED & 0xFF
        client = frames[1]
        rest = frames[2:]
        if header[4] & fr.FLAG_REPLY:
            op = header[3]
            status = _STATUS.unpack_from(header, 6)[0]
            rid = int.from_bytes(header[8:16], "little")
            if op == Op.HEARTBEAT and (client, rid) in self._fanouts:
                self._heartbeat_reply(client, rid, node, rest)
                return
            if not self.inflight.answered(node, (client, rid)) and (client, rid) in self._abandoned:
                del self._abandoned[(client, rid)]  # refused already on the client's behalf
                return
            if op == Op.SUBSCRIBE:
                self._subscribed(client, rid, status, rest)
            elif op == Op.METADATA and not status and self.front_door is not None and self.front_door.placements:
                rest = [self.front_door.without_shares(rest[0]), *rest[1:]]  # no split queue as a whole one
            if status in (_NOT_LEADER, _NOT_COORDINATOR):
                self.follower.refresh()
                if status == _NOT_COORDINATOR:
                    rest = [self._without_coordinator(rest[0]), *rest[1:]]
        self._to_client(client, [bytes(header), *rest])

    def _subscribed(self, client: bytes, rid: int, status: int, rest: list[bytes]) -> None:
        where = self._subscribing.pop((client, rid), None)
        state = self.clients.get(client)
        if where is None or state is None or status:
            return
        try:
            sub = fr.decode_params(rest[0]).get("subscription")
        except FabricError:
            return
        if isinstance(sub, int):
            state.subscriptions[sub] = where[0]
            state.queue_nodes[where[1]] = where[0]

    @staticmethod
    def _without_coordinator(raw: bytes) -> bytes:
        try:
            params = fr.decode_params(raw)
        except FabricError:
            return raw
        params.pop("coordinator", None)
        return fr.encode_params(params)

    # ------------------------------------------------------------------ HEARTBEAT

    def _heartbeat(self, client: bytes, header: fr.Header, state: ClientState, principal: str) -> None:
        nodes = {n for n in state.nodes if n in self.backends}
        rid = header.request_id
        if not nodes:
            self._to_client(client, fr.encode(fr.Header(Op.HEARTBEAT, rid, fr.FLAG_REPLY), {"subscriptions": []}))
            return
        routed = fr.routed(header.encode(), client, principal, [b""])
        sent = set()
        for n in nodes:
            try:
                self.backends[n][1].send_multipart(routed, NOBLOCK)
                sent.add(n)
            except zmq.ZMQError:
                pass
        fan = _Fanout(header.encode(), sent, deadline=time.monotonic() + HEARTBEAT_WAIT_S)
        self._fanouts[(client, rid)] = fan
        if not sent:
            self._finish_fanout(client, rid)

    def _heartbeat_reply(self, client: bytes, rid: int, node: str, rest: list[bytes]) -> None:
        fan = self._fanouts[(client, rid)]
        fan.waiting.discard(node)
        try:
            fan.replies.append(fr.decode_params(rest[0]))
        except FabricError:
            pass
        if not fan.waiting:
            self._finish_fanout(client, rid)

    def _finish_fanout(self, client: bytes, rid: int) -> None:
        fan = self._fanouts.pop((client, rid), None)
        reply = fr.Header(Op.HEARTBEAT, rid, fr.FLAG_REPLY)
        self._to_client(client, fr.encode(reply, merge_heartbeats(fan.replies if fan else [])))

    def _expire_fanouts(self, now: float) -> None:
        for key in [k for k, f in self._fanouts.items() if now >= f.deadline]:
            self._finish_fanout(*key)

    def _sweep(self, now: float) -> None:
        """Forget clients silent for CLIENT_IDLE_S (their sessions on the nodes expired long ago)."""
        self._next_sweep = now + 10.0
        for client in [c for c, s in self.clients.items() if now - s.last_seen > CLIENT_IDLE_S]:
            del self.clients[client]
            self.principals.pop(client, None)
        if len(self._subscribing) > 100_000:  # SUBSCRIBE replies that never came (a node died)
            self._subscribing.clear()
        self.inflight.expired(now)  # nobody waits for these any more: forgotten, not answered


def run(
    name: str,
    listen: str,
    cluster: ClusterConfig,
    *,
    on_ready: Any = None,
    metrics_listen: str = "",
    security: SecurityConfig | None = None,
) -> None:
    """Run a router in the foreground until SIGINT or SIGTERM."""
    router = Router(name, listen, cluster, metrics_listen=metrics_listen, security=security)
    serve_until_signalled(router, on_ready)
