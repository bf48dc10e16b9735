"""The node's stream listener: fabric's messages over plain TCP, read and written by the loop.

Beside the ROUTER socket, a node may listen on a ``fabric://host:port`` endpoint (framing in
:mod:`fabric.protocol.stream`). Its sockets sit in the node's one poller; the event loop reads
them, hands every whole message to the broker exactly as it hands ROUTER messages (with a
6-byte client identity ``b"\\x00S" + u32`` that no ZeroMQ peer can have: libzmq's own are 5
bytes and chosen ones may not start with a zero byte), and writes replies and pushes straight
to the socket. No thread sits between the socket and the broker: that is the point.

Writes that the kernel does not take at once wait in a per-connection queue, flushed when the
socket becomes writable; past ``OUT_MAX`` bytes a send is refused, as a full ZeroMQ pipe
refuses one (the broker counts a dropped reply or keeps a push for later).

With ``auth`` (a node with ``[security] keys_dir``) every connection is TLS with a client
certificate (:mod:`fabric.transport.stream_tls`): a new connection first waits in ``pending``
for its handshake, done a step at a time as its socket becomes ready, and joins ``by_ident``
(the broker can reach it) only when the handshake is done and ``auth`` knows its principal.
A failed, garbled or silent handshake closes that connection only.

On a loopback (or wildcard) endpoint the listener also accepts on the endpoint's abstract Unix
socket (:func:`fabric.protocol.stream.local_address`): clients on the same host connect there
first. Its connections are served exactly as TCP ones (same identities, framing and TLS).
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from fabric.errors import AddressInUse, ConfigError, ProtocolError
from fabric.protocol import stream as st
from fabric.transport import stream_tls as tls

log = logging.getLogger("fabric.stream")
POLLIN, POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)
READ_BYTES = 1 << 20
READS_PER_EVENT = 16  # then the loop serves the others and comes back
OUT_MAX = 64 << 20
IOV_MAX = 512
_IDENT = struct.Struct(">2sI")

Handler = Callable[[bytes, list[bytes], bool], None]  # (client, frames, more input waiting)


def is_stream_client(client: bytes) -> bool:
    return len(client) == 6 and client[:2] == b"\x00S"


OPEN, HELLO, HANDSHAKE = 0, 1, 2  # Peer.state: serving; waiting for a first byte; in a TLS handshake


class Peer:
    __slots__ = (
        "chunk",
        "deadline",
        "decoder",
        "fd",
        "ident",
        "name",
        "out",
        "out_bytes",
        "sock",
        "state",
        "tls",
        "want_out",
    )

    def __init__(self, sock: socket.socket, ident: bytes, max_message_bytes: int, name: str) -> None:
        self.sock: Any = sock  # an ssl.SSLSocket once the TLS handshake started
        self.state = OPEN
        self.tls = False
        self.chunk: Any = None  # TLS: a write OpenSSL did not finish, to offer again
        self.deadline = 0.0
        self.fd = sock.fileno()
        self.ident = ident
        self.decoder = st.StreamDecoder(max_message_bytes)
        self.out: deque[Any] = deque([st.GREETING])
        self.out_bytes = st.GREETING_SIZE
        self.name = name
        self.want_out = False


class StreamListener:
    """Accepts stream connections and moves whole messages between them and the broker."""

    def __init__(
        self, endpoint: str, poller: zmq.Poller, *, max_message_bytes: int, auth: tls.StreamAuth | None = None
    ) -> None:
        try:
            host, port = st.parse_endpoint(endpoint)
        except ProtocolError as exc:
            raise ConfigError(str(exc)) from None
        self.auth = auth
        self.context: ssl.SSLContext | None = auth.stream_tls() if auth is not None else None  # before the bind
        try:
            self.sock = socket.create_server((host, port), family=_family(host), backlog=512, reuse_port=False)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise AddressInUse(f"{endpoint} is in use (by another fabric process or another program)") from None
            raise ConfigError(f"cannot listen on {endpoint}: {exc}") from None
        self.sock.setblocking(False)
        bound = self.sock.getsockname()
        self.endpoint = f"{st.SCHEME}{_host_text(bound[0])}:{bound[1]}"
        self.poller = poller
        self.max_message_bytes = max_message_bytes
        self.listen_fd = self.sock.fileno()
        # the same-host shortcut: clients given a loopback endpoint connect here first
        self.local_name = st.local_address(bound[0], bound[1])
        self.local_sock = _local_listener(self.local_name) if self.local_name is not None else None
        self.local_fd = self.local_sock.fileno() if self.local_sock is not None else -1
        self.by_fd: dict[int, Peer] = {}
        self.by_ident: dict[bytes, Peer] = {}
        self.pending: dict[int, Peer] = {}  # TLS: connections before the end of their handshake
        # One read buffer for every connection: recv(1 MiB) would allocate (and trim) 1 MiB per call
        self._rbuf = bytearray(READ_BYTES)
        self._rview = memoryview(self._rbuf)
        self._next = 0
        poller.register(self.listen_fd, POLLIN)
        if self.local_sock is not None:
            poller.register(self.local_fd, POLLIN)

    # ------------------------------------------------------------------ events

    def on_events(self, events: dict[Any, int], handle: Handler) -> None:
        """Serve every stream socket the poller reported ready."""
        for key, ev in events.items():
            if type(key) is not int:
                continue
            if key == self.listen_fd or key == self.local_fd:
                self._accept(self.sock if key == self.listen_fd else self.local_sock)
                continue
            peer = self.by_fd.get(key)
            if peer is None:
                continue
            if peer.state:
                self._handshake(peer, handle)
                continue
            if ev & POLLOUT:
                self._flush(peer)
            if ev & POLLIN or ev & ~(POLLIN | POLLOUT):  # data, or an error/hang-up to read out
                if peer.tls:
                    self._read_tls(peer, handle)
                else:
                    self._read(peer, handle)

    def _accept(self, listener: Any) -> None:
        for _ in range(64):
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: log, and let the backlog wait
                log.warning("stream accept failed: %s", exc)
                return
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:  # the same-host socket: room for whole batches in flight, as loopback TCP has
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, st.LOCAL_SNDBUF)
                except OSError:
                    pass
            self._next = (self._next + 1) & 0xFFFFFFFF
            ident = _IDENT.pack(b"\x00S", self._next)
            peer = Peer(sock, ident, self.max_message_bytes, f"{addr}" if addr else "on this host")
            self.by_fd[peer.fd] = peer
            self.poller.register(peer.fd, POLLIN)
            if self.context is not None:  # TLS: nothing is said before the handshake
                if len(self.pending) >= tls.PENDING_MAX:
                    self._fail(next(iter(self.pending.values())), "too many handshakes in progress")
                peer.state = HELLO
                peer.deadline = time.monotonic() + tls.HANDSHAKE_S
                self.pending[peer.fd] = peer
                continue
            self.by_ident[ident] = peer
            self._flush(peer)

    # ------------------------------------------------------------------ TLS handshakes

    def _handshake(self, peer: Peer, handle: Handler) -> None:
        """One step of a connection's handshake, when its socket is ready."""
        assert self.context is not None and self.auth is not None
        if peer.state == HELLO:
            try:
                first = peer.sock.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._close(peer, f"read failed: {exc}")
                return
            if not first:
                self._close(peer, "closed by the client before its handshake")
                return
            if first[0] != tls.TLS_RECORD:  # no TLS (a plain client?): served, every request refused
                self._open(peer, None)
                if peer.fd in self.by_fd:
                    self._read(peer, handle)
                return
            try:
                peer.sock = self.context.wrap_socket(peer.sock, server_side=True, do_handshake_on_connect=False)
            except (ssl.SSLError, OSError) as exc:
                self._fail(peer, f"TLS: {exc}")
                return
            peer.state, peer.tls = HANDSHAKE, True
        try:
            peer.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(peer, POLLIN)
            return
        except ssl.SSLWantWriteError:
            self._watch(peer, POLLIN | POLLOUT)
            return
        except (ssl.SSLError, OSError) as exc:
            self._fail(peer, f"TLS handshake failed: {getattr(exc, 'reason', None) or exc}")
            return
        self._watch(peer, POLLIN)
        self._open(peer, peer.sock.getpeercert())
        if peer.fd in self.by_fd:
            self._read_tls(peer, handle)  # what came with the end of the handshake

    def _open(self, peer: Peer, cert: dict[str, Any] | None) -> None:
        assert self.auth is not None
        self.pending.pop(peer.fd, None)
        peer.state = OPEN
        self.auth.admit(peer.ident, cert)
        self.by_ident[peer.ident] = peer
        self._flush(peer)  # the greeting

    def _watch(self, peer: Peer, events: int) -> None:
        want = bool(events & POLLOUT)
        if want != peer.want_out:
            peer.want_out = want
            self.poller.register(peer.fd, events)

    def _fail(self, peer: Peer, why: str) -> None:
        if self.auth is not None:
            self.auth.handshake_failed(peer.name, why)
        self._close(peer, why)

    def expire_handshakes(self, now: float) -> None:
        """Close connections whose handshake has taken longer than ``HANDSHAKE_S`` (``now``:
        ``time.monotonic()``). The node's loop calls this while ``pending`` is not empty."""
        for peer in list(self.pending.values()):
            if now < peer.deadline:
                break  # in the order they came: the rest are younger
            self._fail(peer, f"no TLS handshake within {tls.HANDSHAKE_S:g} s")

    def _read(self, peer: Peer, handle: Handler) -> None:
        for _ in range(READS_PER_EVENT):
            try:
                n = peer.sock.recv_into(self._rbuf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._close(peer, f"read failed: {exc}")
                return
            if not n:
                self._close(peer, "closed by the client")
                return
            try:
                messages = peer.decoder.feed(self._rview[:n])  # the decoder copies what it keeps
            except ProtocolError as exc:
                self._close(peer, str(exc), level=logging.WARNING)
                return
            full = n == READ_BYTES  # the socket may hold more
            last = len(messages) - 1
            for i, frames in enumerate(messages):
                handle(peer.ident, frames, full or i < last)
                if peer.fd not in self.by_fd:
                    return  # the handler's reply found the connection broken
            if not full:
                return

    def _read_tls(self, peer: Peer, handle: Handler) -> None:
        """As ``_read``, through TLS: one record (at most 16 KiB) per read, so read until the
        socket has nothing more (the 1 MiB buffer always takes a whole record: nothing is left
        inside OpenSSL that the poller would not see)."""
        sock = peer.sock
        for _ in range(READS_PER_EVENT * 4):
            try:
                n = sock.recv_into(self._rbuf)
            except tls.WAIT:
                return
            except OSError as exc:
                self._close(peer, f"read failed: {exc}")
                return
            if not n:
                self._close(peer, "closed by the client")
                return
            try:
                messages = peer.decoder.feed(self._rview[:n])
            except ProtocolError as exc:
                self._close(peer, str(exc), level=logging.WARNING)
                return
            last = len(messages) - 1
            for i, frames in enumerate(messages):
                handle(peer.ident, frames, i < last)
                if peer.fd not in self.by_fd:
                    return

    # ------------------------------------------------------------------ sending

    def send(self, client: bytes, frames: Sequence[Any]) -> bool:
        """Queue one message for a stream client and write what the socket takes now."""
        peer = self.by_ident.get(client)
        if peer is None or peer.out_bytes > OUT_MAX:
            return False
        try:
            head = st.envelope(frames)
        except ProtocolError:
            return False
        total = len(head) + sum(map(len, frames))
        out = peer.out
        if out or peer.tls:
            st.enqueue(out, head, frames)
            peer.out_bytes += total
            return self._flush(peer)
        try:  # the common case: nothing waiting, and the kernel takes it all in one call
            sent = peer.sock.sendmsg([head, *frames])
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._close(peer, f"write failed: {exc}")
            return False
        if sent < total:
            st.enqueue(out, head, frames, sent)
            peer.out_bytes += total - sent
            peer.want_out = True  # the rest goes when the socket has room
            self.poller.register(peer.fd, POLLIN | POLLOUT)
        return True

    def _flush(self, peer: Peer) -> bool:
        """Write what the socket takes; watch for writability while anything is left."""
        if peer.tls:
            return self._flush_tls(peer)
        out = peer.out
        while out:
            chunk = list(out) if len(out) <= IOV_MAX else [out[i] for i in range(IOV_MAX)]
            try:
                sent = peer.sock.sendmsg(chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._close(peer, f"write failed: {exc}")
                return False
            peer.out_bytes -= sent
            short = sent < sum(map(len, chunk))
            st.advance(out, sent)
            if short:
                break  # the kernel took less than offered: wait for writability
        want = bool(out)
        if want != peer.want_out:
            peer.want_out = want
            self.poller.register(peer.fd, POLLIN | POLLOUT if want else POLLIN)
        return True

    def _flush_tls(self, peer: Peer) -> bool:
        try:
            sent, peer.chunk = tls.tls_write(peer.sock, peer.out, peer.chunk)
        except OSError as exc:
            self._close(peer, f"write failed: {exc}")
            return False
        peer.out_bytes -= sent
        self._watch(peer, POLLIN | POLLOUT if peer.out or peer.chunk is not None else POLLIN)
        return True

    def _close(self, peer: Peer, why: str, level: int = logging.DEBUG) -> None:
        log.log(level, "stream client %s: %s", peer.name, why)
        self.by_fd.pop(peer.fd, None)
        self.by_ident.pop(peer.ident, None)
        self.pending.pop(peer.fd, None)
        if self.auth is not None:
            self.auth.forget(peer.ident)
        try:
            self.poller.unregister(peer.fd)
        except KeyError:
            pass
        peer.sock.close()

    def close(self) -> None:
        for peer in list(self.by_fd.values()):
            peer.sock.settimeout(0.2)  # last replies: a short blocking write each, then close
            for _ in range(16):
                if peer.state or (not peer.out and peer.chunk is None) or not self._flush(peer):
                    break
            if peer.fd in self.by_fd:
                self._close(peer, "node stopping")
        for fd in (self.listen_fd, self.local_fd):
            try:
                self.poller.unregister(fd)
            except KeyError:
                pass
        self.sock.close()
        if self.local_sock is not None:
            self.local_sock.close()


def _local_listener(name: str) -> socket.socket | None:
    """A listening abstract Unix socket under ``name``; None (and TCP only) when it cannot be had."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)
        sock.listen(512)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        log.info("stream transport: no same-host socket %r (%s); clients on this host use TCP", name[1:], exc)
        return None
    return sock


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host
