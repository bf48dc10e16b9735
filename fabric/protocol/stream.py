"""fabric's stream framing: the same multipart messages over a plain TCP byte stream.

ZeroMQ hands every message to and from a background I/O thread; on a small VM each of those
hand-offs costs a thread wake-up, and a request crosses four of them between two processes.
The stream transport (endpoints ``fabric://host:port``) writes and reads the socket from the
caller's own thread instead. It carries exactly the messages of :mod:`fabric.protocol.frames`
(header frame, params frame, data frames); only the envelope differs::

    greeting    8 bytes, sent by both sides as soon as the connection opens:
                b"FABRIC" | version u8 (1) | reserved u8 (0)
    message     body_len u32 | frame_count u16 | frame_count x frame_len u32 | frames
                (little-endian; body_len counts everything after itself)

A peer whose greeting or envelope is wrong (or whose message exceeds the receiver's limit)
gets its connection closed: unlike a bad frame inside a well-formed message, a broken envelope
leaves no way to find the next message.

Same-host shortcut: a node whose stream endpoint is on a loopback address (or the wildcard) also
accepts the very same byte stream on a Linux abstract Unix socket named after that endpoint
(``local_address``), and a client given a loopback ``fabric://`` endpoint connects there first,
falling back to TCP when nothing listens under the name. The bytes, greeting, TLS and
behaviour are the same; a Unix socket just skips the kernel's TCP path (about half the CPU
of a loopback round trip here). Everything here is pure.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import sys
from collections import deque
from collections.abc import Sequence
from typing import Any

from fabric.errors import ProtocolError

SCHEME = "fabric://"
GREETING = b"FABRIC\x01\x00"
GREETING_SIZE = len(GREETING)
LENGTH = struct.Struct("<I")
COUNT = struct.Struct("<H")
FRAMES_MAX = 0xFFFF
_LEN_COUNT = struct.Struct("<IH")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``fabric://host:port`` -> (host, port); port ``*`` or ``0`` means any free port."""
    if not endpoint.startswith(SCHEME):
        raise ProtocolError(f"a stream endpoint looks like fabric://host:port, got {endpoint!r}")
    host, sep, port = endpoint[len(SCHEME) :].rpartition(":")
    if not sep or not host:
        raise ProtocolError(f"a stream endpoint looks like fabric://host:port, got {endpoint!r}")
    if port in ("*", "0"):
        return host.strip("[]"), 0
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ProtocolError(f"bad port in stream endpoint {endpoint!r}")
    return host.strip("[]"), int(port)


LOCAL_PREFIX = "\0fabric-stream/"
# A Unix socket's send buffer bounds what is in flight (the kernel's default, ~200 KiB, is less
# than one 256 KiB batch; loopback TCP grows its own to 4 MiB): both sides ask for this much
# (the kernel caps it at net.core.wmem_max).
LOCAL_SNDBUF = 4 << 20


def local_address(host: str, port: int) -> str | None:
    """The abstract Unix socket name of the stream endpoint ``host:port`` on this host, or None
    when there is none: not Linux, no port yet, or not a loopback address. The wildcard maps to
    loopback (a node listening on every address serves the local name of 127.0.0.1 or ::1), and
    so does ``localhost``."""
    if not sys.platform.startswith("linux") or not 0 < port < 65536:
        return None
    h = host.strip("[]").lower()
    if h in ("", "0.0.0.0", "*", "localhost"):
        h = "127.0.0.1"
    elif h == "::":
        h = "::1"
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return None
    if not ip.is_loopback:
        return None
    return f"{LOCAL_PREFIX}{ip.compressed}:{port}"


@functools.lru_cache(maxsize=64)
def _lengths(n: int) -> struct.Struct:
    """The frame-length table of an ``n``-frame message."""
    return struct.Struct(f"<{n}I")


def envelope(frames: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """The bytes that go before ``frames`` on the stream (the frames follow as they are)."""
    n = len(frames)
    if not 0 < n <= FRAMES_MAX:
        raise ProtocolError(f"a message has 1..{FRAMES_MAX} frames, not {n}")
    lengths = [len(f) for f in frames]
    body = 2 + 4 * n + sum(lengths)
    if body > 0xFFFFFFFF:
        raise ProtocolError(f"a message of {body} bytes does not fit the stream envelope")
    return _LEN_COUNT.pack(body, n) + _lengths(n).pack(*lengths)


def advance(out: deque[Any], sent: int) -> None:
    """Drop ``sent`` written bytes from the front of a write queue of buffers; a partly written
    head becomes a copy of its rest (the caller may reuse the buffer it came from)."""
    while sent:
        n = len(out[0])
        if sent >= n:
            out.popleft()
            sent -= n
        else:
            out[0] = bytes(memoryview(out[0])[sent:])
            sent = 0


def enqueue(out: deque[Any], head: bytes, frames: Sequence[Any], sent: int = 0) -> None:
    """Put a message (its envelope ``head`` and frames) on a write queue, minus the first ``sent``
    bytes that a write already took."""
    out.append(head)
    out.extend(f for f in frames if len(f))  # an empty frame has no bytes to write
    advance(out, sent)


def encode(frames: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """One whole message as bytes (tests and small messages; senders use envelope + frames)."""
    return envelope(frames) + b"".join(bytes(f) for f in frames)


class StreamDecoder:
    """Turns the bytes of one connection, fed in pieces of any size, into messages.

    ``feed`` returns the messages completed by the new bytes, each a list of frames
    (``bytes``). It raises :class:`ProtocolError` on a wrong greeting or envelope, or a
    message over ``max_message_bytes``; the connection is then unusable.
    """

    def __init__(self, max_message_bytes: int, *, expect_greeting: bool = True) -> None:
        self.max_message_bytes = max_message_bytes
        self._buf = bytearray()
        self._greeted = not expect_greeting

    def feed(self, data: bytes | bytearray | memoryview) -> list[list[bytes]]:
        buf = self._buf
        if not self._greeted:
            buf += data
            if len(buf) < GREETING_SIZE:
                if GREETING[: len(buf)] != buf:
                    raise ProtocolError("the peer does not speak fabric's stream protocol")
                return []
            if buf[:6] != GREETING[:6]:
                raise ProtocolError("the peer does not speak fabric's stream protocol")
            if buf[6] != GREETING[6]:
                raise ProtocolError(f"stream protocol version {buf[6]} not supported (this side speaks 1)")
            del buf[:GREETING_SIZE]
            self._greeted = True
            src: bytes | bytearray | memoryview = buf
        elif buf:
            buf += data
            src = buf
        else:  # nothing left over: read the new bytes where they are (one copy less)
            src = data
        out: list[list[bytes]] = []
        pos, end = 0, len(src)
        while end - pos >= 6:
            body, n = _LEN_COUNT.unpack_from(src, pos)
            if body > self.max_message_bytes:
                raise ProtocolError(f"message of {body} bytes exceeds the limit of {self.max_message_bytes}")
            if n == 0 or body < 2 + 4 * n:
                raise ProtocolError(f"bad stream envelope: {n} frames in {body} bytes")
            if end - pos - 4 < body:
                break
            lengths = _lengths(n).unpack_from(src, pos + 6)
            at = pos + 6 + 4 * n
            if sum(lengths) != body - 2 - 4 * n:
                raise ProtocolError(f"bad stream envelope: frame lengths do not add up to {body} bytes")
            frames = []
            for length in lengths:
                frames.append(bytes(src[at : at + length]))
                at += length
            out.append(frames)
            pos = at
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < end:
            buf += src[pos:]
        return out

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet make a whole message."""
        return len(self._buf)
