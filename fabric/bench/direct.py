"""`fabric bench-direct`: one-way latency of a direct (brokerless) queue against raw pyzmq
PUSH/PULL, side by side in one run, on loopback.

A node is started (``fabric up``, a temporary data dir) only to hold the registry; a consumer
process registers and a producer process sends ``--messages`` messages at ``--rate`` per second,
each carrying its send time (``time.monotonic_ns()``, one clock for the machine) in its first 8
bytes; the consumer records receive minus send. The raw round does the same with a PUSH socket
connected straight to a PULL socket and no fabric code. Rounds alternate ``--runs`` times; the
medians of the percentiles are reported. Every loop is bounded by a count and a deadline.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import statistics
import struct
import tempfile
import time
from typing import Any

STAMP = struct.Struct("<q")
RUN_SECONDS_MAX = 60


def _percentiles(samples: list[int]) -> dict[str, float]:
    s = sorted(samples)

    def at(q: float) -> float:
        return s[min(len(s) - 1, int(q * len(s)))] / 1000  # us

    return {"p50_us": at(0.5), "p99_us": at(0.99), "p999_us": at(0.999), "n": len(s)}


def _consume(kind: str, endpoint: str, queue: str, n: int, ready: Any, out: Any) -> None:
    lat: list[int] = []
    deadline = time.monotonic() + RUN_SECONDS_MAX
    if kind == "raw":
        import zmq

        s: zmq.Socket = zmq.Context.instance().socket(zmq.PULL)
        port = s.bind_to_random_port("tcp://127.0.0.1")
        ready.put(f"tcp://127.0.0.1:{port}")
        while len(lat) < n and time.monotonic() < deadline:
            if s.poll(200):
                m = s.recv()
                lat.append(time.monotonic_ns() - STAMP.unpack_from(m)[0])
        s.close(0)
    else:
        from fabric.client import Consumer

        c = Consumer(queue, endpoint, heartbeat_ms=1000)
        ready.put(c.connected_to)
        while len(lat) < n and time.monotonic() < deadline:
            b = c.poll_batch(200)
            if b is not None:
                now = time.monotonic_ns()
                lat.extend(now - STAMP.unpack_from(v)[0] for v in b.values)
        c.close()
    out.put(lat)


def _produce(kind: str, endpoint: str, queue: str, n: int, size: int, rate: int) -> None:
    pad = b"\0" * max(0, size - 8)
    t0 = time.monotonic()
    deadline = t0 + RUN_SECONDS_MAX
    if kind == "raw":
        import zmq

        s: zmq.Socket = zmq.Context.instance().socket(zmq.PUSH)
        s.connect(endpoint)
        time.sleep(0.3)
        t0 = time.monotonic()
        for i in range(n):
            due = t0 + i / rate
            while time.monotonic() < due:
                time.sleep(max(0.0, min(0.001, due - time.monotonic())))
            s.send(STAMP.pack(time.monotonic_ns()) + pad)
            if time.monotonic() > deadline:
                break
        s.close(linger=2000)
        return
    from fabric.client import Producer

    with Producer(endpoint, linger_ms=0) as p:
        p.send(queue, STAMP.pack(time.monotonic_ns()) + pad)  # learn the consumers; counted as the first
        t0 = time.monotonic()
        for i in range(1, n):
            due = t0 + i / rate
            while time.monotonic() < due:
                time.sleep(max(0.0, min(0.001, due - time.monotonic())))
            p.send(queue, STAMP.pack(time.monotonic_ns()) + pad)
            if time.monotonic() > deadline:
                break


def _round(kind: str, endpoint: str, queue: str, n: int, size: int, rate: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    cons = ctx.Process(target=_consume, args=(kind, endpoint, queue, n, ready, out))
    cons.start()
    where = ready.get(timeout=30)
    if kind == "direct":
        time.sleep(0.5)  # the registration is in place before the producer looks
    prod = ctx.Process(target=_produce, args=(kind, where if kind == "raw" else endpoint, queue, n, size, rate))
    prod.start()
    lat = out.get(timeout=RUN_SECONDS_MAX + 30)
    prod.join(30)
    cons.join(30)
    return _percentiles(lat)


def run_direct_bench(*, messages: int, size: int, rate: int, runs: int, progress: bool = True) -> dict[str, Any]:
    from fabric.client import Admin
    from fabric.testing import Node

    data = tempfile.mkdtemp(prefix="fabric-bench-direct-")
    node = Node(data)
    try:
        with Admin(node.endpoint) as admin:
            admin.create_queue("direct-bench", mode="direct")
        figures: dict[str, list[dict[str, float]]] = {"direct": [], "raw": []}
        for i in range(runs):
            order = ("direct", "raw") if i % 2 == 0 else ("raw", "direct")
            for kind in order:
                r = _round(kind, node.endpoint, "direct-bench", messages, size, rate)
                figures[kind].append(r)
                if progress:
                    print(f"  run {i + 1}: {kind:6s} p50 {r['p50_us']:8.1f} us  p99 {r['p99_us']:8.1f} us", flush=True)
        med = {
            k: {q: statistics.median(r[q] for r in v) for q in ("p50_us", "p99_us", "p999_us")}
            for k, v in figures.items()
        }
        ratio = med["direct"]["p50_us"] / med["raw"]["p50_us"]
        if progress:  # else (--json) the returned figures are all
            print(
                f"direct queue vs raw pyzmq PUSH/PULL, {messages} x {size} B at {rate}/s, median of {runs}:\n"
                f"  direct: p50 {med['direct']['p50_us']:.1f} us, p99 {med['direct']['p99_us']:.1f} us\n"
                f"  raw:    p50 {med['raw']['p50_us']:.1f} us, p99 {med['raw']['p99_us']:.1f} us\n"
                f"  p50 ratio {ratio:.2f}x",
                flush=True,
            )
        return {"messages": messages, "size": size, "rate": rate, "runs": runs, "median": med, "p50_ratio": ratio}
    finally:
        node.stop()
        shutil.rmtree(data, ignore_errors=True)
