"""What the client's per-message path costs, each beside its floor (docs/performance.md, "The
per-message path"):

    python -m tools.per_message            # ~30 s: a fresh embedded node for the send() figure

1. ``Producer.send()`` of a 100 B value, one call per message, against a fresh node (linger 5 ms,
   fsync always): the calling thread's CPU per call (``time.thread_time``), the sealing, encoding
   and sending of each batch included; beside it, a Python function of the same signature that
   only appends to a list (the least a ``send()`` with these parameters can be).
2. ``ReceivedBatch.messages()`` on a 1,000-record batch: per ``Message``; beside it, the same
   columns zipped into plain tuples (what "as cheap as a tuple" means), and the same fields as a
   frozen dataclass (what ``Message`` was) and as a ``__slots__`` class, built the same way.
3. Decoding a pushed chunk (``decode_pushed``: CRC, record count, values) per record, of one
   2,500-record batch and of one-record batches; beside it, ``crc32c`` alone over the same bytes.
4. ``Consumer.commit()`` after every ``poll_batch()`` of a group member fed one message at a time
   (a ``linger_ms=0`` producer at 2,000 msg/s in another process, a fresh node): the time the
   application spends inside ``commit()``, p50 and p99 (``--commit-only`` runs just this one; it
   uses only the public client API, so it measures an older build the same way).

Best of several rounds (the machine is shared: the least disturbed round is the cost).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from fabric.client import Admin, Consumer, Producer
from fabric.protocol.batch import crc32c, encode_batch, stamp
from fabric.testing import Node

VALUE = b"x" * 100


def _best_ns(fn: Callable[[], object], per: int, rounds: int) -> float:
    """The least thread CPU of ``rounds`` calls of ``fn``, per item (``fn`` does ``per`` items)."""
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time_ns()
        fn()
        best = min(best, (time.thread_time_ns() - t) / per)
    return best


def send_costs(count: int, rounds: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        node = Node(d)
        try:
            with Admin(node.endpoint) as admin:
                admin.create_queue("m")
            p = Producer(node.endpoint, linger_ms=5)
            send = p.send

            def loop() -> None:
                for _ in range(count):
                    send("m", VALUE)

            loop()  # warm: the queue looked up, the first batches sent
            p.flush(60)
            cost = _best_ns(loop, count, rounds)
            p.flush(60)
            p.close()
        finally:
            node.stop()
    sink: list[bytes] = []

    def floor(queue: str, value: bytes, key: object = None, headers: object = None, partition: object = None,
              timestamp_ms: object = None, callback: object = None, delay_ms: object = None,
              deliver_at_ms: object = None, ttl_ms: object = None, priority: object = None,
              dedup_id: object = None) -> None:  # fmt: skip
        sink.append(value)

    def floor_loop() -> None:
        sink.clear()
        for _ in range(count):
            floor("m", VALUE)

    return cost, _best_ns(floor_loop, count, rounds)


@dataclass(frozen=True, slots=True)
class FrozenMessage:  # Message as it was before it became a msgspec.Struct
    queue: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None
    headers: dict[str, bytes] | None = None
    timestamp_ms: int = 0
    receive_count: int = 1


class SlotsMessage:
    __slots__ = ("headers", "key", "offset", "partition", "queue", "receive_count", "timestamp_ms", "value")

    def __init__(self, queue: str, partition: int, offset: int, value: bytes, key: bytes | None = None,
                 headers: dict[str, bytes] | None = None, timestamp_ms: int = 0, receive_count: int = 1) -> None:  # fmt: skip
        self.queue, self.partition, self.offset, self.value = queue, partition, offset, value
        self.key, self.headers, self.timestamp_ms, self.receive_count = key, headers, timestamp_ms, receive_count


def message_costs(rounds: int) -> dict[str, float]:
    from fabric.client.messages import ReceivedBatch

    n = 1000
    b = ReceivedBatch("q", 0, 0, [VALUE] * n, None, None, None, 0)

    def columns() -> tuple[Any, ...]:
        return repeat("q", n), repeat(0, n), range(n), b.values, repeat(None, n), repeat(None, n), repeat(0, n)

    return {
        "Message": _best_ns(b.messages, n, rounds),
        "tuple": _best_ns(lambda: list(zip(*columns())), n, rounds),
        "frozen dataclass": _best_ns(lambda: list(map(FrozenMessage, *columns())), n, rounds),
        "__slots__ class": _best_ns(lambda: list(map(SlotsMessage, *columns())), n, rounds),
    }


def decode_costs(rounds: int) -> tuple[float, float, float, float]:
    from fabric.client.messages import decode_pushed

    big = bytearray(encode_batch([VALUE] * 2500))
    stamp(big, 0)
    ones = bytearray()
    for i in range(100):
        one = bytearray(encode_batch([VALUE]))
        stamp(one, i)
        ones += one
    big_b, ones_b = bytes(big), bytes(ones)
    view = memoryview(big_b)
    return (
        _best_ns(lambda: decode_pushed("q", 0, big_b, 0), 2500, rounds),
        _best_ns(lambda: crc32c(view[21:]), 2500, rounds),
        _best_ns(lambda: decode_pushed("q", 0, ones_b, 0), 100, rounds),
        _best_ns(lambda: [crc32c(memoryview(ones_b)[i * 161 + 21 : (i + 1) * 161]) for i in range(100)], 100, rounds),
    )


def _paced_sends(endpoint: str, rate: int, seconds: float) -> None:
    p = Producer(endpoint, linger_ms=0)
    t0 = time.monotonic()
    for i in range(int(rate * seconds)):
        time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        p.send("c", VALUE)
    p.flush(60)
    p.close()


def commit_costs(rate: int = 2000, seconds: float = 4.0) -> tuple[float, float, int]:
    """p50 and p99 (us) of the time inside commit(), and how many commits were timed."""
    import multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        node = Node(d)
        try:
            with Admin(node.endpoint) as admin:
                admin.create_queue("c", fsync="interval")
            c = Consumer("c", node.endpoint, group="g", start="earliest")
            proc = mp.get_context("spawn").Process(target=_paced_sends, args=(node.endpoint, rate, seconds))
            proc.start()
            spent: list[int] = []
            got, total = 0, int(rate * seconds)
            deadline = time.monotonic() + seconds + 30
            while got < total and time.monotonic() < deadline:
                b = c.poll_batch(500)
                if b is None:
                    continue
                got += len(b)
                t = time.perf_counter_ns()
                c.commit()
                spent.append(time.perf_counter_ns() - t)
            c.close()
            proc.join(30)
        finally:
            node.stop()
    spent.sort()
    return spent[len(spent) // 2] / 1000, spent[int(len(spent) * 0.99)] / 1000, len(spent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sends", type=int, default=100_000, help="send() calls per round (default 100,000)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of each measurement; the best counts")
    ap.add_argument("--commit-only", action="store_true", help="only the time inside commit() (4.)")
    a = ap.parse_args()
    if a.commit_only:
        p50, p99, n = commit_costs()
        print(f"time inside commit(), {n:,} commits: p50 {p50:,.1f} us, p99 {p99:,.1f} us")
        return
    send, send_floor = send_costs(a.sends, a.rounds)
    print(
        f"send() of 100 B, thread CPU per call: {send:,.0f} ns (a Python function of its signature that appends: {send_floor:,.0f} ns)"
    )
    m = message_costs(a.rounds * 20)
    print(
        f"Message per record (ReceivedBatch.messages, 1,000 records): {m['Message']:,.0f} ns (plain tuples of the "
        f"columns: {m['tuple']:,.0f} ns; a frozen dataclass: {m['frozen dataclass']:,.0f} ns; a __slots__ class: "
        f"{m['__slots__ class']:,.0f} ns)"
    )
    big, big_crc, one, one_crc = decode_costs(a.rounds * 20)
    print(f"decode_pushed per record, one 2,500-record batch: {big:,.0f} ns (crc32c alone: {big_crc:,.1f} ns)")
    print(f"decode_pushed per one-record batch: {one:,.0f} ns (crc32c alone: {one_crc:,.0f} ns)")
    p50, p99, n = commit_costs()
    print(f"time inside commit(), {n:,} commits: p50 {p50:,.1f} us, p99 {p99:,.1f} us")


if __name__ == "__main__":
    main()
