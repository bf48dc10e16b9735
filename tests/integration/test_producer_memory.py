"""What a producer keeps alive: a future answers with the offset and error of its message, so
keeping futures must not keep their batches' payloads; per-message callbacks stay on the fast
send path and each fires once with its own offset."""

from __future__ import annotations

import gc
import time
import tracemalloc

import pytest

from fabric.client import Admin, Producer

pytestmark = pytest.mark.integration


def test_kept_futures_do_not_keep_their_batches(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("mem", fsync="never")
    payload = b"x" * 1000
    kept = []
    with Producer(node.endpoint, linger_ms=5, batch_bytes=256 * 1024) as p:
        p.send("mem", payload).result(10)  # describe done, connection up: not counted below
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for i in range(40_000):  # 40 MB of payload
                f = p.send("mem", payload)
                if i % 1000 == 0:
                    kept.append(f)  # one future per ~4 batches, as the report did
            p.flush(30)
            # a batch sent without a copy stays referenced until pyzmq's garbage-collector thread
            # hears that libzmq wrote it, which under load comes a moment after the ack: wait for
            # that (kept batches would stay at ~40 MB however long this waits)
            deadline = time.monotonic() + 10
            while True:
                gc.collect()
                grown = tracemalloc.get_traced_memory()[0] - base
                if grown < 2_000_000 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        finally:
            tracemalloc.stop()
    offsets = [f.result(1).offset for f in kept]
    assert offsets == sorted(offsets) and offsets[0] == 1 and offsets[-1] == 39_001
    assert grown < 2_000_000, f"{grown:,} bytes still held by 40 kept futures"


def test_callbacks_fire_once_each_with_their_own_offset(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("cb", fsync="never")
    seen: list[int] = []
    errors: list[BaseException] = []

    def on_ack(meta, err):
        if err is not None:
            errors.append(err)
        else:
            seen.append(meta.offset)

    for linger in (0, 5):
        seen.clear()
        with Producer(node.endpoint, linger_ms=linger) as p:
            start = p.send("cb", b"first").result(10).offset + 1
            for i in range(5000):
                p.send("cb", b"m%d" % i, callback=on_ack)
            p.flush(30)
            # flush() returns after the callbacks ran, not just after the acknowledgements came
            assert not errors
            assert sorted(seen) == list(range(start, start + 5000)), f"linger {linger}"
