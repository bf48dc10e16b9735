"""Strict ordering with a real node: records appended in clock order, late ones to <queue>.late."""

from __future__ import annotations

import threading
import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.client.hlc import header_value
from fabric.protocol.batch import encode_batch
from fabric.protocol.ops import Op
from fabric.transport.connection import Connection, raise_for_status

from ..conftest import drain

pytestmark = pytest.mark.integration


def _raw_send(conn: Connection, queue: str, value: bytes, clock_ms: int) -> dict:
    hlc = clock_ms << 16
    batch = encode_batch([value], headers=[{"x-hlc": header_value(hlc)}], timestamps=[clock_ms])
    return raise_for_status(conn.request(Op.PRODUCE, {"queue": queue, "partition": 0}, [batch])).params


def test_records_are_appended_in_clock_order_and_late_ones_go_aside(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("ledger", ordering="strict", ordering_window_ms=400)
    now = int(time.time() * 1000)
    results: dict[str, dict] = {}

    def send(name: str, clock_ms: int, after_s: float) -> None:
        time.sleep(after_s)
        conn = Connection(node.endpoint)
        try:
            results[name] = _raw_send(conn, "ledger", name.encode(), clock_ms)
        finally:
            conn.close()

    # "b" happened first by its clock but arrives 150 ms after "a": within the window, it goes first
    threads = [
        threading.Thread(daemon=True, target=send, args=("a", now + 100, 0.0)),
        threading.Thread(daemon=True, target=send, args=("b", now + 50, 0.15)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["b"]["record_offsets"] == [[0]] and results["a"]["record_offsets"] == [[1]]
    conn = Connection(node.endpoint)
    try:  # far behind what is already appended: never out of order, set aside instead
        late = _raw_send(conn, "ledger", b"late", now - 10_000)
    finally:
        conn.close()
    assert late["record_offsets"] == [[-1]]
    with Consumer("ledger", node.endpoint, start="earliest") as c:
        got = drain(c, 2, 10)
    assert [m.value for m in got] == [b"b", b"a"]
    with Consumer("ledger.late", node.endpoint, start="earliest") as c:
        aside = drain(c, 1, 10)
    assert [m.value for m in aside] == [b"late"]
    assert aside[0].headers["x-late-partition"] == b"0" and int(aside[0].headers["x-late-by-ms"]) >= 10_000


def test_producers_stamp_hybrid_clocks_and_get_their_offsets(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("events", ordering="strict", ordering_window_ms=500)
    futures = []
    with Producer(node.endpoint) as p1, Producer(node.endpoint, linger_ms=0) as p2:
        for i in range(200):
            futures.append(p1.send("events", b"p1-%d" % i))
            futures.append(p2.send("events", b"p2-%d" % i))
        results = [f.result(10) for f in futures]
    offsets = [r.offset for r in results]
    assert sorted(offsets) == list(range(400)) and not any(r.late for r in results)
    with Consumer("events", node.endpoint, start="earliest") as c:
        got = drain(c, 400, 10)
    clocks = [int(m.headers["x-hlc"]) for m in got]
    assert clocks == sorted(clocks), "the log is not in clock order"
    assert [m.offset for m in got] == list(range(400))
    with pytest.raises(Exception, match="no delays"), Producer(node.endpoint) as p:
        p.send("events", b"x", delay_ms=1000).result(10)
