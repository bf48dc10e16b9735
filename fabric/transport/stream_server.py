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
"""

from __future__ import annotations

import logging
import socket
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from fabric.errors import ConfigError, ProtocolError
from fabric.protocol import stream as st

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


class Peer:
    __slots__ = ("decoder", "fd", "ident", "name", "out", "out_bytes", "sock", "want_out")

    def __init__(self, sock: socket.socket, ident: bytes, max_message_bytes: int, name: str) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.ident = ident
        self.decoder = st.StreamDecoder(max_message_bytes)
        self.out: deque[Any] = deque([st.GREETING])
        self.out_bytes = st.GREETING_SIZE
        self.name = name
        self.want_out = False


class StreamListener:
    """Accepts stream connections and moves whole messages between them and the broker."""

    def __init__(self, endpoint: str, poller: zmq.Poller, *, max_message_bytes: int) -> None:
        try:
            host, port = st.parse_endpoint(endpoint)
        except ProtocolError as exc:
            raise ConfigError(str(exc)) from None
        try:
            self.sock = socket.create_server((host, port), family=_family(host), backlog=512, reuse_port=False)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {endpoint}: {exc}") from None
        self.sock.setblocking(False)
        bound = self.sock.getsockname()
        self.endpoint = f"{st.SCHEME}{_host_text(bound[0])}:{bound[1]}"
        self.poller = poller
        self.max_message_bytes = max_message_bytes
        self.listen_fd = self.sock.fileno()
        self.by_fd: dict[int, Peer] = {}
        self.by_ident: dict[bytes, Peer] = {}
        # One read buffer for every connection: recv(1 MiB) would allocate (and trim) 1 MiB per call
        self._rbuf = bytearray(READ_BYTES)
        self._rview = memoryview(self._rbuf)
        self._next = 0
        poller.register(self.listen_fd, POLLIN)

    # ------------------------------------------------------------------ events

    def on_events(self, events: dict[Any, int], handle: Handler) -> None:
        """Serve every stream socket the poller reported ready."""
        for key, ev in events.items():
            if type(key) is not int:
                continue
            if key == self.listen_fd:
                self._accept()
                continue
            peer = self.by_fd.get(key)
            if peer is None:
                continue
            if ev & POLLOUT:
                self._flush(peer)
            if ev & POLLIN or ev & ~(POLLIN | POLLOUT):  # data, or an error/hang-up to read out
                self._read(peer, handle)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: log, and let the backlog wait
                log.warning("stream accept failed: %s", exc)
                return
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._next = (self._next + 1) & 0xFFFFFFFF
            ident = _IDENT.pack(b"\x00S", self._next)
            peer = Peer(sock, ident, self.max_message_bytes, f"{addr}")
            self.by_fd[peer.fd] = peer
            self.by_ident[ident] = peer
            self.poller.register(peer.fd, POLLIN)
            self._flush(peer)

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
        if out:
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

    def _close(self, peer: Peer, why: str, level: int = logging.DEBUG) -> None:
        log.log(level, "stream client %s: %s", peer.name, why)
        self.by_fd.pop(peer.fd, None)
        self.by_ident.pop(peer.ident, None)
        try:
            self.poller.unregister(peer.fd)
        except KeyError:
            pass
        peer.sock.close()

    def close(self) -> None:
        for peer in list(self.by_fd.values()):
            peer.sock.settimeout(0.2)  # last replies: a short blocking write each, then close
            for _ in range(16):
                if not peer.out or not self._flush(peer):
                    break
            if peer.fd in self.by_fd:
                self._close(peer, "node stopping")
        try:
            self.poller.unregister(self.listen_fd)
        except KeyError:
            pass
        self.sock.close()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host
