"""Direct (brokerless) queues on the client side: a queue with ``mode = "direct"`` in its settings.

Producers send straight to consumers; the node only keeps the registry of who consumes. A
consumer binds a PULL socket (``FABRIC_DIRECT_BIND`` or ``Consumer(direct_bind=...)``, default
``tcp://127.0.0.1:*``) and registers it with SUBSCRIBE ``kind = "direct"``; its heartbeats keep
the registration (a consumer silent past its session timeout is dropped from it). A producer
reads the live endpoints with DESCRIBE_QUEUE (again at most every ``REFRESH_S``, and at once when
a send finds no consumer), keeps one PUSH socket per consumer, and sends each message as a record
batch of one: by key to the consumer with the highest rendezvous weight for the key (a key stays
with its consumer while that consumer lives), without a key round robin.

Delivery is **at most once**: nothing is stored, nothing is acknowledged. A send that finds no
consumer able to take it now (none registered, gone, or its pipe full) fails at once with
NOT_DELIVERED (the future's ``result()`` raises it, the callback gets it); the message is gone.
Options that need a log (``acks="all"`` producers, delays, TTL, priorities, dedup ids) are
refused with BAD_PARAMETER.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

from fabric.client.batches import Callback, RecordMetadata, as_bytes
from fabric.client.messages import ReceivedBatch
from fabric.errors import BadParameter, FabricError, NotDelivered
from fabric.protocol.batch import (
    HAS_HEADERS,
    HAS_KEYS,
    HAS_TIMESTAMPS,
    check_batch,
    decode_records,
    decode_values,
    encode_batch,
)
from fabric.protocol.ops import Op
from fabric.transport.direct import PeerPull, PeerPush

REFRESH_S = 1.0


class SentFuture:
    """The outcome of a direct send: already decided when ``send()`` returns."""

    __slots__ = ("_error", "_meta")

    def __init__(self, meta: RecordMetadata | None, error: FabricError | None) -> None:
        self._meta = meta
        self._error = error

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if self._error is not None:
            raise self._error
        assert self._meta is not None
        return self._meta


class DirectSender:
    """A producer's sends to one direct queue."""

    def __init__(self, queue: str, lookup: Callable[[], list[str]]) -> None:
        self.queue = queue
        self._lookup = lookup
        self._push = PeerPush()
        self._endpoints: list[str] = []
        self._next_refresh = 0.0
        self._rr = 0
        self.dropped = 0
        self.sent = 0

    def _refresh(self, now: float) -> None:
        self._endpoints = self._lookup()
        self._push.update(self._endpoints)
        self._next_refresh = now + REFRESH_S

    def send(
        self,
        value: bytes,
        key: bytes | None,
        headers: dict[str, bytes] | None,
        timestamp_ms: int | None,
        callback: Callback | None,
    ) -> SentFuture:
        now = time.monotonic()
        if now >= self._next_refresh or not self._endpoints:
            self._refresh(now)
        ts = timestamp_ms if timestamp_ms is not None else time.time_ns() // 1_000_000
        if key is None and not headers:  # the common case: values only, the consumer's fast path
            frame = encode_batch([value], first_timestamp=ts, max_timestamp=ts)
        else:
            frame = encode_batch(
                [value],
                keys=[key] if key is not None else None,
                headers=[headers] if headers else None,
                first_timestamp=ts,
                max_timestamp=ts,
            )
        ok = False
        if self._endpoints:
            if key is not None:
                ok = self._push.send(_by_key(key, self._endpoints), frame)
            else:
                for _ in range(len(self._endpoints)):  # the next consumer that can take it
                    self._rr = (self._rr + 1) % len(self._endpoints)
                    if self._push.send(self._endpoints[self._rr], frame):
                        ok = True
                        break
        if ok:
            self.sent += 1
            fut = SentFuture(RecordMetadata(self.queue, 0, None), None)
        else:
            self.dropped += 1
            self._next_refresh = 0.0  # look again before the next send
            why = "no consumer is registered" if not self._endpoints else "no consumer could take it now"
            fut = SentFuture(None, NotDelivered(f"direct queue {self.queue!r}: {why}; the message is dropped"))
        if callback is not None:
            callback(fut._meta, fut._error)
        return fut

    def close(self) -> None:
        self._push.close()


def _by_key(key: bytes, endpoints: list[str]) -> str:
    return max(endpoints, key=lambda e: hashlib.blake2b(key + b"\x00" + e.encode(), digest_size=8).digest())


def check_direct_options(acks: str, props: Any, dedup_id: str | None) -> None:
    if acks == "all":
        raise BadParameter("a direct queue is at most once: a producer with acks='all' cannot send to it")
    if (props is not None and any(x is not None for x in props)) or dedup_id is not None:
        raise BadParameter("a direct queue stores nothing: delays, TTL, priorities and dedup ids do not apply")


def send_peer(
    sender: DirectSender,
    lock: threading.Lock,
    acks: str,
    value: bytes | str,
    key: bytes | str | None,
    headers: dict[str, bytes | str] | None,
    timestamp_ms: int | None,
    callback: Callback | None,
    props: Any,
    dedup_id: str | None,
) -> Any:
    """A producer's send to a direct queue: straight to a consumer, at most once. ``lock``: the
    producer's, held around the PUSH sockets (used by one thread at a time)."""
    check_direct_options(acks, props, dedup_id)
    hdrs = {k: as_bytes(v, "header value") for k, v in headers.items()} if headers else None
    if type(value) is not bytes:
        value = as_bytes(value, "value")
    with lock:
        return sender.send(value, None if key is None else as_bytes(key, "key"), hdrs, timestamp_ms, callback)


class DirectReceiver:
    """A consumer's side of a direct queue: its PULL socket and its registration."""

    def __init__(
        self,
        queue: str,
        request: Callable[[Op, dict[str, Any]], dict[str, Any]],
        *,
        bind: str | None,
        heartbeat_s: float,
        session_timeout_ms: int,
    ) -> None:
        self.queue = queue
        self._request = request
        self._pull = PeerPull(bind)
        self.endpoint = self._pull.endpoint
        self._heartbeat_s = heartbeat_s
        self._session_timeout_ms = session_timeout_ms
        self._next_heartbeat = 0.0
        self.received = 0
        self.subscription = 0
        self.register()

    def register(self) -> None:
        reply = self._request(
            Op.SUBSCRIBE,
            {
                "queue": self.queue,
                "kind": "direct",
                "endpoint": self.endpoint,
                "session_timeout_ms": self._session_timeout_ms,
            },
        )
        self.subscription = reply["subscription"]
        self._next_heartbeat = time.monotonic() + self._heartbeat_s

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self._heartbeat_s
        held = self._request(Op.HEARTBEAT, {}).get("subscriptions", [])
        if self.subscription not in held:  # the node forgot us (restart, session expiry): again
            self.register()

    def next_batch(self, timeout_ms: int) -> ReceivedBatch | None:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._housekeeping()
            left = deadline - time.monotonic()
            wait = int(max(0.0, min(left, self._heartbeat_s)) * 1000)
            frame = self._pull.recv(wait)
            if frame is not None:
                b = self._decode(frame)
                if b is not None:
                    return b
            if time.monotonic() >= deadline:
                return None

    def _decode(self, frame: bytes) -> ReceivedBatch | None:
        try:
            h = check_batch(frame)
            if h.attributes & (HAS_KEYS | HAS_HEADERS | HAS_TIMESTAMPS):
                r = decode_records(frame)
                values, keys, headers, stamps = r.values, r.keys, r.headers, r.timestamps
            else:
                values, keys, headers, stamps = decode_values(frame, 0, h)[1], None, None, None
        except FabricError:
            return None  # not a record batch: not from a fabric producer
        base = self.received
        self.received += len(values)
        return ReceivedBatch(self.queue, 0, base, values, keys, headers, stamps, h.first_timestamp)

    def close(self) -> None:
        self._pull.close()
