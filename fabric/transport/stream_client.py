"""The client side of fabric's stream transport (``fabric://host:port`` endpoints).

Same messages, same replies and pushes as the ZeroMQ transport; the difference is who touches
the socket: here the calling thread writes a request straight into the kernel and reads
replies straight out of it, so a message crosses no thread hand-off inside the client (framing
in :mod:`fabric.protocol.stream`, the node's side in :mod:`fabric.transport.stream_server`).

Behaviour matches the DEALER connection where callers can see it: nothing is queued while
there is no connection (a send then reports no room, as ZMQ_IMMEDIATE does), the connection
is re-made in the background of later calls with a backoff of 100 ms doubling to 2 s, and a
request in flight when the connection breaks gets no reply. ``generation()`` counts the breaks,
so a caller that watches it (the Producer) resends at once instead of waiting for its request
timeout. A peer that vanishes without closing (host down, network cut) is caught by the kernel
when ``heartbeat_ms`` is given: TCP keepalive probes an idle link and TCP_USER_TIMEOUT closes one
whose written bytes stay unacknowledged that long; either way the next read fails and the link
is dropped like a closed one.

With credentials that include TLS files (:func:`fabric.transport.connection.use_credentials`)
the connection is TLS: the handshake and the node's greeting are awaited when the link is made
(blocking, within ``CONNECT_TIMEOUT_S``), because under TLS 1.3 a node that refuses the client's
certificate says so only after the client's side of the handshake is done. A refusal (an alert)
or a node certificate that does not verify is remembered, and the next request that finds no link
raises it (NotAuthorized, or ConnectionFailed) instead of waiting out its timeout.

Given a loopback endpoint (127.0.0.0/8, ::1, localhost), a connection first tries the node's
same-host socket, an abstract Unix socket named after the endpoint
(:func:`fabric.protocol.stream.local_address`), and uses TCP when nothing listens there (a
node of an older version, a proxy on that port). Everything above the socket is the same; a
node that dies closes a Unix socket as surely as a TCP one, so heartbeats need no keepalive
there. ``LOCAL_SHORTCUT = False`` turns the shortcut off in this process.
"""

from __future__ import annotations

import itertools
import select
import socket
import ssl
import time
from collections import deque
from typing import Any

from fabric.errors import ConnectionFailed, FabricError, NotAuthorized, ProtocolError
from fabric.protocol import frames as fr
from fabric.protocol import stream as st
from fabric.transport import stream_tls
from fabric.transport.connection import BaseConnection, tls_context

RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 2.0
CONNECT_TIMEOUT_S = 2.0
READ_BYTES = 1 << 20
OUT_MAX = 64 << 20  # bytes waiting for the kernel before sends report no room
IN_MAX = 2 * 1024 * 1024 * 1024 - 1  # the node enforces its own limit; this only bounds a broken peer
IOV_MAX = 512
POLLIN, POLLOUT = select.POLLIN, select.POLLOUT
LOCAL_SHORTCUT = True  # loopback endpoints: try the node's same-host Unix socket first


class StreamConnection(BaseConnection):
    def __init__(self, endpoint: str, *, timeout_ms: int = 30_000, heartbeat_ms: int | None = None) -> None:
        try:
            self.host, self.port = st.parse_endpoint(endpoint)
        except ProtocolError as exc:
            raise FabricError(str(exc)) from None
        if self.port == 0:
            raise FabricError(f"a client needs the node's port, not a wildcard: {endpoint!r}")
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self._local = st.local_address(self.host, self.port) if LOCAL_SHORTCUT else None
        self.local = False  # the link is the same-host Unix socket, not TCP
        self._ids = itertools.count(1)
        self.events: deque[fr.Message] = deque()
        self._stray: dict[int, fr.Message] = {}
        self._inbox: deque[fr.Message] = deque()
        self._sock: socket.socket | None = None
        self._poll = select.poll()
        self._decoder = st.StreamDecoder(IN_MAX)
        # a reused read buffer: recv(1 MiB) would allocate (and trim) 1 MiB on every call
        self._rbuf = bytearray(READ_BYTES)
        self._rview = memoryview(self._rbuf)
        self._out: deque[Any] = deque()
        self._out_bytes = 0
        self._next_attempt = 0.0
        self._backoff = RECONNECT_MIN_S
        self._closed = False
        self._heartbeat_ms = heartbeat_ms
        self._lost = 0  # links dropped so far (generation)
        self._tls: ssl.SSLContext | None = tls_context()
        self._chunk: Any = None  # TLS: a write OpenSSL did not finish, to offer again
        self._refused: FabricError | None = None  # why the last connect failed for good (TLS), if it did
        # a plain socket returns a short read when it is empty; a TLS one reads one record at a time
        self._short_read = READ_BYTES if self._tls is None else 0
        self._ensure()  # like a ZeroMQ connect: a node not up yet is tried again later

    # ------------------------------------------------------------------ connection

    def _ensure(self) -> bool:
        if self._sock is not None:
            return True
        if self._closed:
            raise FabricError("connection is closed")
        now = time.monotonic()
        if now < self._next_attempt:
            return False
        sock = _connect_local(self._local) if self._local is not None else None
        local = sock is not None
        if sock is None:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S)
            except OSError:
                self._next_attempt = now + self._backoff
                self._backoff = min(self._backoff * 2, RECONNECT_MAX_S)
                return False
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        decoder = st.StreamDecoder(IN_MAX)
        if self._tls is not None:
            tls_sock = self._handshake(sock, decoder)
            if tls_sock is None:
                self._next_attempt = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, RECONNECT_MAX_S)
                return False
            sock = tls_sock
        sock.setblocking(False)
        if self._heartbeat_ms is not None and not local:
            keepalive(sock, self._heartbeat_ms)
        self._sock = sock
        self.local = local
        self._poll.register(sock.fileno(), POLLIN)
        self._decoder = decoder
        self._out = deque([st.GREETING])
        self._out_bytes = st.GREETING_SIZE
        self._chunk = None
        self._backoff = RECONNECT_MIN_S
        return True

    def _handshake(self, sock: socket.socket, decoder: st.StreamDecoder) -> ssl.SSLSocket | None:
        """TLS over a new connection, up to the node's greeting (which says it took our
        certificate); None, and the socket closed, when it failed."""
        assert self._tls is not None
        where = f"the node at {self.endpoint}"
        try:
            tls_sock = self._tls.wrap_socket(sock, server_hostname=self.host)  # blocking, CONNECT_TIMEOUT_S
            self._refused = None
            got = 0
            while got < st.GREETING_SIZE:
                data = tls_sock.recv(READ_BYTES)
                if not data:
                    raise ConnectionResetError("closed by the node")
                for frames in decoder.feed(data):  # nothing follows the greeting yet; kept if it does
                    self._inbox.append(fr.decode(frames))
                got += len(data)
            return tls_sock
        except ssl.SSLCertVerificationError as exc:
            self._refused = ConnectionFailed(
                f"{where} is not the deployment's node: its TLS certificate does not verify "
                f"({exc.verify_message}; the client checks it against ca.crt beside FABRIC_SERVER_CERT)"
            )
        except (OSError, ProtocolError) as exc:
            if stream_tls.is_refusal(exc):
                self._refused = NotAuthorized(
                    f"{where} refused the TLS handshake: {getattr(exc, 'reason', None) or exc} (this client's "
                    "certificate is not signed by its CA, or is missing; see `fabric auth add-client`)"
                )
            elif isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
                self._refused = ConnectionFailed(
                    f"TLS with {where} failed: {getattr(exc, 'reason', None) or exc} (does it have "
                    "[security] keys_dir? without it its stream transport is plain)"
                )
            # else: reset, closed or timed out (a node stopping or not up yet): tried again later
        sock.close()
        return None

    def refused(self) -> FabricError | None:
        """Why the last attempt to connect failed for good (a refused TLS handshake), if it did."""
        return self._refused

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            self._poll.unregister(sock.fileno())
        except (KeyError, ValueError):
            pass
        sock.close()
        self._lost += 1
        self._out.clear()
        self._out_bytes = 0
        self._chunk = None
        self._next_attempt = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, RECONNECT_MAX_S)

    def close(self) -> None:
        if self._sock is not None and self._out:
            try:  # last words (an UNSUBSCRIBE, final acks): a short blocking write
                self._sock.settimeout(0.2)
                for _ in range(16):
                    if self.flush() or self._sock is None:
                        break
            except OSError:
                pass
        self._drop()
        self._closed = True

    def fileno(self) -> int | None:
        return self._sock.fileno() if self._sock is not None else None

    def generation(self) -> int:
        return self._lost

    # ------------------------------------------------------------------ writing

    def send_frames(self, frames: list[Any], copy: bool = True) -> bool:
        if not self._ensure():
            return False
        if self._out_bytes > OUT_MAX and not self.flush():
            return False
        head = st.envelope(frames)
        total = len(head) + sum(map(len, frames))
        if self._out or self._tls is not None:
            st.enqueue(self._out, head, frames)
            self._out_bytes += total
            self.flush()
            self.sent_generation = self._lost
            return self._sock is not None
        try:  # the common case: nothing waiting, and the kernel takes it all in one call
            sent = self._sock.sendmsg([head, *frames])  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop()
            return False
        if sent < total:  # the rest goes when the socket has room (flush)
            st.enqueue(self._out, head, frames, sent)
            self._out_bytes += total - sent
        self.sent_generation = self._lost
        return True

    def flush(self) -> bool:
        out, sock = self._out, self._sock
        if self._tls is not None:
            return self._flush_tls()
        while out and sock is not None:
            chunk = list(out) if len(out) <= IOV_MAX else [out[i] for i in range(IOV_MAX)]
            try:
                sent = sock.sendmsg(chunk)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                self._drop()
                return False
            self._out_bytes -= sent
            short = sent < sum(map(len, chunk))
            st.advance(out, sent)
            if short:
                return False
        return not out

    def _flush_tls(self) -> bool:
        sock = self._sock
        if sock is None:
            return not self._out
        try:
            sent, self._chunk = stream_tls.tls_write(sock, self._out, self._chunk)  # type: ignore[arg-type]
        except OSError:
            self._drop()
            return False
        self._out_bytes -= sent
        return not self._out and self._chunk is None

    def pending_output(self) -> bool:
        return bool(self._out) or self._chunk is not None

    def _send_waiting(self, frames: list[Any], copy: bool, wait_ms: int) -> bool:
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            if self._refused is not None and self._sock is None:
                raise type(self._refused)(self._refused.message)
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._sock is None:
                time.sleep(min(left, max(0.001, self._next_attempt - time.monotonic())))
            else:
                self._wait(left, writable=True)
            if self.send_frames(frames, copy):
                return True

    # ------------------------------------------------------------------ reading

    def _fill(self) -> bool:
        """Read what the socket has now; True when a whole message is waiting."""
        sock = self._sock
        for _ in range(16):
            if sock is None:
                break
            try:
                n = sock.recv_into(self._rbuf)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError:
                self._drop()
                break
            if not n:
                self._drop()  # the node went away: reconnect on a later call
                break
            try:
                messages = self._decoder.feed(self._rview[:n])  # the decoder copies what it keeps
            except ProtocolError:
                self._drop()  # not a fabric stream endpoint, or a broken envelope
                break
            for frames in messages:
                try:
                    self._inbox.append(fr.decode(frames))
                except ProtocolError:
                    pass  # a malformed message from the server is dropped, not fatal
            if n < self._short_read:
                break
        return bool(self._inbox)

    def readable(self) -> bool:
        return bool(self._inbox) or self._fill()

    def recv_nowait(self) -> fr.Message | None:
        if self._inbox or self._fill():
            return self._inbox.popleft()
        return None

    def recv_buffered(self) -> fr.Message | None:
        return self._inbox.popleft() if self._inbox else None

    def drain(self) -> list[fr.Message]:
        """What one pass over the socket gives (no second read just to learn it is empty)."""
        if not self._inbox:
            self._fill()
        out = list(self._inbox)
        self._inbox.clear()
        return out

    def recv(self, timeout_ms: int) -> fr.Message | None:
        """The next message, or None if nothing came within ``timeout_ms``.

        Waits before it reads: callers come here after ``recv_nowait`` found nothing."""
        if self._inbox:
            return self._inbox.popleft()
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = deadline - time.monotonic()
            if self._sock is None and not self._ensure():
                if left <= 0:
                    return None
                time.sleep(min(left, max(0.001, self._next_attempt - time.monotonic())))
                continue
            self._wait(left)
            if self._fill():
                return self._inbox.popleft()
            if deadline - time.monotonic() <= 0:
                return None

    def _wait(self, seconds: float, *, writable: bool = False) -> None:
        """Poll the socket for input (and for room, while bytes wait to be written)."""
        sock = self._sock
        if sock is None:
            return
        want_out = writable or bool(self._out) or self._chunk is not None
        fd = sock.fileno()
        if want_out:
            self._poll.modify(fd, POLLIN | POLLOUT)
        try:
            ready = self._poll.poll(max(0, int(seconds * 1000)))
        finally:
            if want_out and self._sock is sock:
                self._poll.modify(fd, POLLIN)
        if want_out and any(ev & POLLOUT for _, ev in ready):
            self.flush()


def _connect_local(name: str) -> socket.socket | None:
    """A connection to a node's same-host socket, or None when nothing listens under ``name``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, st.LOCAL_SNDBUF)
        sock.connect(name)
    except OSError:
        sock.close()
        return None
    return sock


def keepalive(sock: socket.socket, heartbeat_ms: int) -> None:
    """Let the kernel declare a silent peer dead after about ``heartbeat_ms`` (Linux options;
    elsewhere whatever the platform offers)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, heartbeat_ms // 2000)  # keepalive counts whole seconds
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", idle), ("TCP_KEEPCNT", 2)):
        opt = getattr(socket, name, None)
        if opt is not None:
            sock.setsockopt(socket.IPPROTO_TCP, opt, value)
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
    if user_timeout is not None:
        sock.setsockopt(socket.IPPROTO_TCP, user_timeout, max(1000, heartbeat_ms))
