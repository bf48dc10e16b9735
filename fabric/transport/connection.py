"""A connection to a fabric node: request ids, replies, pushed events.

Two transports behind one interface: a ZeroMQ DEALER (``tcp://``, ``ipc://`` endpoints; the
only client module that imports zmq) and fabric's stream transport (``fabric://`` endpoints,
:mod:`fabric.transport.stream_client`), which reads and writes the socket from the caller's thread.
:func:`connect` picks by the endpoint. Not thread-safe: each Producer, Consumer and Admin
owns its own connection (the Producer guards its one with its lock).
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import struct
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq

from fabric.errors import (
    BadParameter,
    ConnectionFailed,
    FabricError,
    NotAuthorized,
    ProtocolError,
    Timeout,
    error_for_code,
)
from fabric.protocol import frames as fr
from fabric.protocol.ops import RESENDABLE, Op
from fabric.transport.endpoints import check_endpoint, ipv6

NOBLOCK, EVENTS, POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)
LINK_CHECK_MS = 200  # a request waiting for its reply looks this often whether the link was lost
COPY_BELOW = 64 * 1024  # smaller frames are copied: cheaper than zero-copy bookkeeping
DEFAULT_ENDPOINT = os.environ.get("FABRIC_ENDPOINT", "tcp://127.0.0.1:7420")


def _context() -> zmq.Context:
    return zmq.Context.instance()


def connect(
    endpoint: str | None = None,
    *,
    timeout_ms: int = 30_000,
    hwm: int = 10_000,
    heartbeat_ms: int | None = None,
    spread: bool = True,
    curve: tuple[bytes, bytes, bytes] | None = None,
    fail_refused: bool = False,
) -> BaseConnection:
    """A connection over the transport that ``endpoint`` names (default ``$FABRIC_ENDPOINT``).

    Given a list of endpoints (a cluster's routers or nodes) it uses one at a time, starting at a
    random one so that clients spread over the list (``spread=False``: start at the first).

    ``heartbeat_ms``: watch the link (see :meth:`BaseConnection.generation`) and declare it lost
    when the node has been silent that long (ZeroMQ heartbeats; TCP keepalive and user timeout
    on the stream transport). None: no liveness check beyond what the transport reports.

    ``curve``: CurveZMQ keys for this connection only (public, secret, the server's public key),
    instead of the process's ``use_credentials`` (a node connecting to another with the cluster's
    internal identity); ZeroMQ endpoints only.

    ``fail_refused``: a request fails with ConnectionFailed as soon as every endpoint refused the
    connection (nothing listens there), instead of waiting out ``timeout_ms`` for a node to come:
    for the shell commands, which report an unreachable endpoint; ZeroMQ endpoints only."""
    endpoint = check_endpoint(endpoint or DEFAULT_ENDPOINT)
    if endpoint.startswith("fabric://"):
        from fabric.transport.stream_client import StreamConnection

        return StreamConnection(endpoint, timeout_ms=timeout_ms, heartbeat_ms=heartbeat_ms)
    return Connection(
        endpoint,
        timeout_ms=timeout_ms,
        hwm=hwm,
        heartbeat_ms=heartbeat_ms,
        spread=spread,
        curve=curve,
        fail_refused=fail_refused,
    )


class BaseConnection:
    """What every transport provides; ``request`` and the reply bookkeeping are shared."""

    endpoint: str
    timeout_ms: int
    events: deque[fr.Message]
    _stray: dict[int, fr.Message]
    _ids: itertools.count[int]
    # the generation of the link the last message was written on (what ``generation`` counted
    # when the write succeeded): a loss counted after it is a loss with that message in flight
    sent_generation: int = 0

    def close(self) -> None:
        raise NotImplementedError

    def next_id(self) -> int:
        return next(self._ids)

    def send(
        self,
        op: Op,
        params: dict[str, Any] | bytes | None = None,
        data: Sequence[Any] = (),
        *,
        flags: int = 0,
        request_id: int | None = None,
        timeout_ms: int | None = None,
    ) -> int:
        """Send one request; wait up to ``timeout_ms`` for room, else raise ConnectionFailed."""
        rid = self.next_id() if request_id is None else request_id
        frames = fr.encode(fr.Header(int(op), rid, flags), params, data)
        copy = not data or len(data[0]) < COPY_BELOW
        if self.send_frames(frames, copy):  # the common case: room now, no waiting
            return rid
        wait = self.timeout_ms if timeout_ms is None else timeout_ms
        if not self._send_waiting(frames, copy, wait):
            raise ConnectionFailed(f"cannot reach a fabric node at {self.endpoint} (waited {wait} ms)")
        return rid

    def _send_waiting(self, frames: list[Any], copy: bool, wait_ms: int) -> bool:
        """Send once the transport has room, waiting up to ``wait_ms``; False if it never had."""
        raise NotImplementedError

    def send_frames(self, frames: list[Any], copy: bool = True) -> bool:
        """Send an encoded message without waiting; False when the transport has no room (or peer)."""
        raise NotImplementedError

    def readable(self) -> bool:
        """True when a message can be read now without waiting."""
        raise NotImplementedError

    def fileno(self) -> int | None:
        """A descriptor that polls readable when messages may be waiting (None: not connected)."""
        raise NotImplementedError

    def flush(self) -> bool:
        """Write what waits for room; True when nothing is left waiting."""
        return True

    def current_endpoint(self) -> str:
        """The endpoint in use now (of a list: the one this connection is on)."""
        return self.endpoint

    def generation(self) -> int:
        """How many times the link to the node was lost so far. When it moves, every request sent
        before is lost (no reply will come) unless its reply was already read. Only connections
        made with ``heartbeat_ms`` (ZeroMQ) count; the stream transport always does."""
        return 0

    def watch_fds(self) -> list[int]:
        """Descriptors to poll besides ``fileno()``: readable when ``generation`` may have moved."""
        return []

    def move_on(self) -> bool:
        """Leave the endpoint in use for the next one given (the node in use said it can neither
        serve nor pass on a request: cut off from its peers, or fenced). Counted as a lost link:
        requests in flight on it are resent by their owners. False when given only one endpoint."""
        return False

    def pending_output(self) -> bool:
        """True while bytes wait for the transport to take them (the ZeroMQ one never says so)."""
        return False

    def recv(self, timeout_ms: int) -> fr.Message | None:
        raise NotImplementedError

    def recv_nowait(self) -> fr.Message | None:
        raise NotImplementedError

    def recv_buffered(self) -> fr.Message | None:
        """A message already read off the transport, if any: never a system call. A caller that
        finds none waits with ``recv`` (a poll first, which returns at once if bytes are there)."""
        return self.recv_nowait()  # ZeroMQ: an EVENTS check, no system call

    def drain(self) -> list[fr.Message]:
        """Every message that can be read now without waiting."""
        out = []
        while (msg := self.recv_nowait()) is not None:
            out.append(msg)
        return out

    def request(
        self,
        op: Op,
        params: dict[str, Any] | bytes | None = None,
        data: Sequence[Any] = (),
        *,
        timeout_ms: int | None = None,
        resend: bool | None = None,
    ) -> fr.Message:
        """Send a request and wait for its reply; raise the reply's error if it carries one.

        When the link is lost with the request in flight (``generation`` moves: the node went
        away, or a connection given several endpoints moved to the next), its reply is lost with
        it. A request that is safe to do twice (``RESENDABLE``, or ``resend=True``) is then sent
        again as soon as the link is back, within the same timeout; any other raises
        ConnectionFailed at once, saying it may or may not have been done, rather than waiting
        out the timeout for a reply that cannot come."""
        wait = self.timeout_ms if timeout_ms is None else timeout_ms
        again = op in RESENDABLE if resend is None else resend
        # One safe to repeat is sent again after any loss since it was handed over (a link lost
        # while it was being sent leaves it unclear whether it went). Any other counts losses
        # from the link it was written on: one that goes down after the write (the router that
        # took it died) fails it at once as in flight. Reading ``generation()`` again after the
        # send instead would count such a loss, if its event was still unread, as before the
        # write, and the request would wait out its whole timeout for a reply that cannot come.
        gen = self.generation()
        rid = self.send(op, params, data, timeout_ms=wait)
        if not again:
            gen = self.sent_generation
        deadline = time.monotonic() + wait / 1000
        look = time.monotonic() + LINK_CHECK_MS / 1000  # when to look at the link next
        while True:
            if rid in self._stray:
                return raise_for_status(self._stray.pop(rid))
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                raise Timeout(f"no reply to {op.name} from {self.endpoint} within {wait} ms")
            msg = self.recv(min(left, LINK_CHECK_MS))
            if msg is not None:
                if msg.header.request_id == rid and not msg.header.flags & fr.FLAG_EVENT:
                    return raise_for_status(msg)
                self._keep(msg)
                if time.monotonic() < look:
                    continue
            look = time.monotonic() + LINK_CHECK_MS / 1000
            if self.generation() == gen:
                continue
            # The link was lost since the request went. A reply read off it before still counts.
            while (msg := self.recv_nowait()) is not None:
                if msg.header.request_id == rid and not msg.header.flags & fr.FLAG_EVENT:
                    return raise_for_status(msg)
                self._keep(msg)
            if not again:
                lost = ConnectionFailed(
                    f"the link to {self.current_endpoint()} was lost with {op.name} in flight: "
                    "it may or may not have been done"
                )
                lost.details = {"in_flight": True}
                raise lost
            gen = self.generation()
            rid = self.send(op, params, data, timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)))

    def _keep(self, msg: fr.Message) -> None:
        """A message read while waiting for another's reply: an event, or a reply someone takes later."""
        if msg.header.flags & fr.FLAG_EVENT:
            self.events.append(msg)
        elif len(self._stray) < 1024:
            self._stray[msg.header.request_id] = msg

    def take_reply(self, request_id: int) -> fr.Message | None:
        """The reply to a request sent without waiting, if it arrived while ``request`` waited."""
        return self._stray.pop(request_id, None)


HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_CREDENTIALS: list[tuple[bytes, bytes, bytes] | None] = []  # (public, secret, server public), loaded once
_TLS_FILES: list[tuple[str, str] | None] = []  # (CA certificate, client key + certificate), beside those
_TLS_CONTEXT: list[Any] = []  # the ssl.SSLContext made from them, once, when a fabric:// endpoint needs it


def use_credentials(client_cert: str | None, server_cert: str | None) -> None:
    """CurveZMQ keys for every connection this process makes from now on: the client's key pair
    (``issued/NAME.key_secret`` from `fabric auth add-client`) and the nodes' public key
    (``server.key``). None, None: no authentication. The defaults come from the environment,
    ``FABRIC_CLIENT_CERT`` and ``FABRIC_SERVER_CERT``.

    The stream transport (``fabric://``) uses TLS when the files `fabric auth` wrote beside them
    are there: the client's key and certificate ``NAME.pem`` beside ``NAME.key_secret``, and the
    deployment's CA certificate ``ca.crt`` beside ``server.key``. Without them a ``fabric://``
    connection is plain (a node with authentication on refuses its requests)."""
    _CREDENTIALS.clear()
    _TLS_FILES.clear()
    _TLS_CONTEXT.clear()
    if not client_cert and not server_cert:
        _CREDENTIALS.append(None)
        _TLS_FILES.append(None)
        return
    if not client_cert or not server_cert:
        raise BadParameter("authentication needs both the client's key pair and the server's public key")
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(client_cert)
        server, _ = zmq.auth.load_certificate(server_cert)
    except (OSError, ValueError) as exc:
        raise BadParameter(f"cannot read the CurveZMQ keys: {exc}") from None
    if secret is None:
        raise BadParameter(f"{client_cert} holds no secret key: give the client its .key_secret file")
    _CREDENTIALS.append((public, secret, server))
    name = os.path.basename(client_cert).removesuffix(".key_secret")
    bundle = os.path.join(os.path.dirname(client_cert), f"{name}.pem")
    ca = os.path.join(os.path.dirname(server_cert), "ca.crt")
    _TLS_FILES.append((ca, bundle) if os.path.exists(bundle) and os.path.exists(ca) else None)


def credentials() -> tuple[bytes, bytes, bytes] | None:
    if not _CREDENTIALS:
        use_credentials(os.environ.get("FABRIC_CLIENT_CERT"), os.environ.get("FABRIC_SERVER_CERT"))
    return _CREDENTIALS[0]


def tls_context() -> Any:
    """The ``ssl.SSLContext`` of this process's ``fabric://`` connections, None without TLS files."""
    credentials()
    files = _TLS_FILES[0]
    if files is None:
        return None
    if not _TLS_CONTEXT:
        import ssl

        from fabric.transport.stream_tls import client_context

        try:
            _TLS_CONTEXT.append(client_context(*files))
        except (OSError, ssl.SSLError) as exc:
            raise BadParameter(f"cannot load the TLS files {files[1]} and {files[0]}: {exc}") from None
    return _TLS_CONTEXT[0]


FAILOVER_HEARTBEAT_MS = 1000  # a connection given several endpoints watches its link this closely
FAILOVER_AFTER_S = 2.0  # an endpoint that has not completed a handshake this long is passed over


class Connection(BaseConnection):
    """A ZeroMQ DEALER connection (``tcp://`` or ``ipc://``)."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout_ms: int = 30_000,
        hwm: int = 10_000,
        heartbeat_ms: int | None = None,
        spread: bool = True,
        curve: tuple[bytes, bytes, bytes] | None = None,
        fail_refused: bool = False,
    ) -> None:
        self.endpoint = endpoint or DEFAULT_ENDPOINT
        if not self.endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise FabricError(
                f"endpoint must look like tcp://host:port (ZeroMQ) or fabric://host:port (stream), got {self.endpoint!r}"
            )
        self.timeout_ms = timeout_ms
        self.sock = _context().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a peer not yet connected
        self.sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        self._monitor: zmq.Socket | None = None
        self._lost = 0
        self._refused: str | None = None  # why the node refused the handshake (CurveZMQ), if it did
        self._fail_refused = fail_refused
        self._refused_by: set[bytes] = set()  # with fail_refused: endpoints that refused the connection
        creds = curve if curve is not None else credentials()
        if creds is not None:
            self.sock.setsockopt(zmq.CURVE_SECRETKEY, creds[1])
            self.sock.setsockopt(zmq.CURVE_PUBLICKEY, creds[0])
            self.sock.setsockopt(zmq.CURVE_SERVERKEY, creds[2])
        # a comma-separated list: one endpoint at a time, the next one when the link is lost
        self._endpoints = self.endpoint.split(",")
        self._current = random.randrange(len(self._endpoints)) if spread else 0
        self._others = self._other_endpoints()  # events about these are stale: see _on_event
        self._stalled_since = 0.0  # when sends began to find no room on a link marked up
        if len(self._endpoints) > 1 and heartbeat_ms is None:
            heartbeat_ms = FAILOVER_HEARTBEAT_MS
        if heartbeat_ms is not None:
            # ZMTP PINGs every quarter of heartbeat_ms; a link silent for the other three quarters
            # after a PING is closed (EVENT_DISCONNECTED below), where the kernel would keep a
            # vanished peer's connection open for minutes. The node's libzmq I/O thread answers
            # the PINGs itself, however busy the node's Python thread is.
            self.sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, heartbeat_ms // 4))
            self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, heartbeat_ms * 3 // 4))
            self.sock.setsockopt(zmq.HEARTBEAT_TTL, max(100, 3 * heartbeat_ms))
        # Every connection watches for a refused handshake (a node with authentication on, a
        # client without the right keys): requests then fail with NOT_AUTHORIZED at once instead
        # of waiting out their timeout. Watched links (heartbeat_ms) follow the link too.
        self._watched = heartbeat_ms is not None
        events = HANDSHAKE_FAILED
        if self._watched:
            events |= zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED
        if fail_refused:
            events |= zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED
        self._monitor = self.sock.get_monitor_socket(events)
        # Watched links send nothing between a DISCONNECTED event and the next handshake: libzmq
        # reports the disconnect a moment before it drops the old pipe, and a message written into
        # that pipe in between would vanish with no event to say so.
        self._up = not self._watched
        self._connect_started = time.monotonic()
        self.sock.setsockopt(zmq.IPV6, ipv6(self._endpoints[self._current]))  # a node at tcp://[::1]:PORT
        self.sock.connect(self._endpoints[self._current])
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)
        self._ids = itertools.count(1)
        self.events: deque[fr.Message] = deque()  # pushed messages read while waiting for a reply
        self._stray: dict[int, fr.Message] = {}

    def close(self) -> None:
        if self._monitor is not None:
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._monitor.close(linger=0)
        self.sock.close(linger=0)

    def generation(self) -> int:
        mon = self._monitor
        if mon is not None:
            while int(mon.get(EVENTS)) & POLLIN:  # the monitor's FD is edge-like: drain it every time
                try:
                    frames = mon.recv_multipart(NOBLOCK)
                except zmq.Again:
                    break
                event = struct.unpack_from("=H", frames[0])[0] if len(frames[0]) >= 6 else 0
                self._on_event(event, frames[1] if len(frames) > 1 else b"")
            if (
                not self._up
                and len(self._endpoints) > 1
                and time.monotonic() - self._connect_started > FAILOVER_AFTER_S
            ):
                self._next_endpoint()  # this one does not answer at all: try the next
        return self._lost

    def _on_event(self, event: int, endpoint: bytes) -> None:
        """One socket monitor event about the link to ``endpoint`` (as given to ``connect``).

        Given several endpoints, an event about one this connection has moved away from is
        stale and ignored: libzmq reports a retry of the endpoint just left, or the handshake
        of one connected a moment before moving on, after the move. Taken for the current one,
        a stale retry moved the connection back to the endpoint that had died, and a stale
        handshake then marked that dead link up, so it never moved again and nothing it sent
        ever left (a producer stalled for good after the router it used was killed)."""
        if event & HANDSHAKE_FAILED:
            if endpoint not in self._others:
                self._refused = (
                    "it refused this client's credentials"
                    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    else "the handshake failed (it requires CurveZMQ keys, or this client's keys do not match it)"
                )
            return
        if self._fail_refused:  # a retry follows a refused (or failed) connect; a handshake, a node
            if event == zmq.EVENT_CONNECT_RETRIED:
                self._refused_by.add(endpoint)
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._refused_by.clear()
        if endpoint in self._others:
            return
        if event == zmq.EVENT_DISCONNECTED:
            self._drop_link()
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._up = True
            self._stalled_since = 0.0
        elif event == zmq.EVENT_CONNECT_RETRIED and not self._up and len(self._endpoints) > 1:
            self._next_endpoint()  # refused outright (nothing listens there): the next one now

    def current_endpoint(self) -> str:
        return self._endpoints[self._current]

    def _next_endpoint(self) -> None:
        try:
            self.sock.disconnect(self._endpoints[self._current])
        except zmq.ZMQError:
            pass
        self._current = (self._current + 1) % len(self._endpoints)
        self._others = self._other_endpoints()
        self._connect_started = time.monotonic()
        self._stalled_since = 0.0
        self.sock.setsockopt(zmq.IPV6, ipv6(self._endpoints[self._current]))  # a node at tcp://[::1]:PORT
        self.sock.connect(self._endpoints[self._current])

    def _other_endpoints(self) -> frozenset[bytes]:
        current = self._endpoints[self._current]
        return frozenset(e.encode() for e in self._endpoints if e != current)

    def watch_fds(self) -> list[int]:
        return [] if self._monitor is None or not self._watched else [int(self._monitor.get(zmq.FD))]

    def send_frames(self, frames: list[Any], copy: bool = True) -> bool:
        if not self._up:
            self.generation()  # a handshake since?
            if not self._up:
                return False
        try:
            self.sock.send_multipart(frames, NOBLOCK, copy=copy)
        except zmq.Again:
            self._no_room()
            return False
        self._stalled_since = 0.0
        self.sent_generation = self._lost
        return True

    def _no_room(self) -> None:
        """A send found no room on a link marked up. With the request-reply traffic of a client
        the high-water mark (``hwm`` messages) is never near: there is no live pipe, whatever the
        events said. Given several endpoints, a link in that state for ``FAILOVER_AFTER_S`` is
        counted lost and the next endpoint tried (the net under an event order not foreseen)."""
        if len(self._endpoints) < 2:
            return
        now = time.monotonic()
        if not self._stalled_since:
            self._stalled_since = now
        elif now - self._stalled_since > FAILOVER_AFTER_S:
            self._drop_link()

    def move_on(self) -> bool:
        if len(self._endpoints) < 2:
            return False
        self._drop_link()
        return True

    def _drop_link(self) -> None:
        """The link in use is gone: count the loss (requests in flight on it get no reply) and,
        given several endpoints, move to the next."""
        self._lost += 1
        self._up = False
        if len(self._endpoints) > 1:
            self._next_endpoint()

    def readable(self) -> bool:
        return bool(self.sock.get(EVENTS) & POLLIN)

    def fileno(self) -> int | None:
        return int(self.sock.get(zmq.FD))

    def _send_waiting(self, frames: list[Any], copy: bool, wait_ms: int) -> bool:
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            # given several endpoints, one that does not answer is passed over while we wait
            self.generation()
            if self._refused is not None:
                where = self._endpoints[self._current]
                if not speaks_zmtp(where):
                    raise ConnectionFailed(
                        f"cannot reach a fabric node at {where}: the connection is closed before any ZeroMQ "
                        "handshake (no fabric node there: another service, or a proxy or firewall in between)"
                    )
                raise NotAuthorized(
                    f"the node at {where} refused the connection: {self._refused} "
                    "(FABRIC_CLIENT_CERT / FABRIC_SERVER_CERT, see `fabric auth`)"
                )
            if self._fail_refused and len(self._refused_by) >= len(self._endpoints):
                raise ConnectionFailed(
                    f"cannot reach a fabric node at {self.endpoint}: connection refused (nothing listens there)"
                )
            if self.send_frames(frames, copy):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.poll(max(1, int(min(left, 0.1) * 1000)), zmq.POLLOUT)

    def recv(self, timeout_ms: int) -> fr.Message | None:
        """The next message, or None if nothing came within ``timeout_ms``."""
        if not self._poller.poll(timeout_ms):
            return None
        return self.recv_nowait()

    def recv_nowait(self) -> fr.Message | None:
        if not self.sock.get(EVENTS) & POLLIN:  # cheaper than raising zmq.Again
            return None
        try:
            frames = self.sock.recv_multipart(NOBLOCK)
        except zmq.Again:
            return None
        try:
            return fr.decode(frames)
        except ProtocolError:
            return None  # a malformed message from the server is dropped, not fatal


def raise_for_status(msg: fr.Message) -> fr.Message:
    if msg.header.status:
        err = error_for_code(msg.header.status, str(msg.params.get("message", "")))
        err.details = {k: v for k, v in msg.params.items() if k not in ("error", "message")}
        raise err
    return msg


ZMTP_PROBE_S = 0.5  # how long speaks_zmtp waits for a peer's greeting


def speaks_zmtp(endpoint: str, timeout_s: float = ZMTP_PROBE_S) -> bool:
    """Whether ``tcp://HOST:PORT`` answers a TCP connect with the start of a ZeroMQ greeting
    (0xFF, then 0x7F at byte 9), within ``timeout_s``. A fabric node, secured or not, does; a
    peer that accepts and closes (a proxy, a firewall, another service) does not. Used once, to
    say which of the two failed a handshake: libzmq reports both the same way. Endpoints other
    than tcp:// count as speaking it (nothing to probe)."""
    if not endpoint.startswith("tcp://"):
        return True
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b"\xff" + b"\x00" * 8 + b"\x7f")  # our signature: a ZMTP peer answers with its own
            got = b""
            deadline = time.monotonic() + timeout_s
            while len(got) < 10 and time.monotonic() < deadline:
                chunk = sock.recv(10 - len(got))
                if not chunk:
                    break
                got += chunk
    except (OSError, ValueError):
        return False
    return len(got) == 10 and got[0] == 0xFF and got[9] == 0x7F
