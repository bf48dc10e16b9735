"""The stream transport (fabric://) against a real node process: same API, same guarantees."""

from __future__ import annotations

import socket
import time

import pytest

from fabric.bench import Node
from fabric.client import Admin, Consumer, Producer
from fabric.errors import FabricError, MessageTooLarge, UnknownQueue
from fabric.protocol import frames as fr
from fabric.protocol import stream as sf
from fabric.protocol.ops import Op
from tests.conftest import drain, kill9

pytestmark = pytest.mark.integration


@pytest.fixture
def snode(tmp_path):
    n = Node(str(tmp_path / "data"), stream="fabric://127.0.0.1:0")
    try:
        yield n
    finally:
        n.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_node_reports_its_stream_endpoint(snode):
    assert snode.stream_endpoint.startswith("fabric://127.0.0.1:")
    with Admin(snode.stream_endpoint) as admin:
        assert admin.ping()["node"] == "node-1"


def test_send_and_receive_in_order_over_both_transports(snode):
    with Admin(snode.stream_endpoint) as admin:
        admin.create_queue("s", partitions=2)
    n = 30_000
    with Producer(snode.stream_endpoint, linger_ms=1) as producer:
        futures = [producer.send("s", b"%d" % i, key=b"k%d" % (i % 10)) for i in range(n)]
        producer.flush()
    assert all(f.result().offset is not None for f in futures)
    # a stream consumer and a ZeroMQ consumer read the same log
    for endpoint in (snode.stream_endpoint, snode.endpoint):
        with Consumer("s", endpoint, start="earliest") as consumer:
            got = drain(consumer, n)
        assert sorted(int(m.value) for m in got) == list(range(n))
        by_part: dict[int, list[int]] = {}
        for m in got:
            by_part.setdefault(m.partition, []).append(m.offset)
        assert all(offs == list(range(len(offs))) for offs in by_part.values())


def test_queue_subscription_leases_and_acks_over_stream(snode):
    with Admin(snode.stream_endpoint) as admin:
        admin.create_queue("jobs")
    with Producer(snode.stream_endpoint) as producer:
        for i in range(500):
            producer.send("jobs", b"j%d" % i)
    with Consumer("jobs", snode.stream_endpoint, group="w", kind="queue", auto_ack=False) as c:
        got = drain(c, 500)
        c.ack(got)
        c.flush_acks()
    assert len({m.value for m in got}) == 500
    with Admin(snode.endpoint) as admin:
        d = admin.describe_queue("jobs")
    assert d["groups"]["w"]["total_lag"] == 0


def test_errors_come_back_as_over_zeromq(snode):
    with Admin(snode.stream_endpoint) as admin:
        with pytest.raises(UnknownQueue):
            admin.describe_queue("nope")
        admin.create_queue("small", max_message_bytes=1000)
    with Producer(snode.stream_endpoint) as producer, pytest.raises(MessageTooLarge):
        producer.send("small", b"x" * 2000)


def test_garbage_and_oversize_peers_are_cut_off_and_the_node_lives_on(snode):
    host, port = sf.parse_endpoint(snode.stream_endpoint)
    # a peer that does not greet: the node closes it
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert s.recv(100) == sf.GREETING  # the node greets first ...
        assert s.recv(100) == b""  # ... then closes the connection
    # a message announcing more than the node's limit: closed before the body is read
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(sf.GREETING + b"\xff\xff\xff\x7f\x01\x00")
        s.recv(100)
        assert s.recv(100) == b""
    # a well-formed envelope around a malformed fabric message gets an error reply, not a close
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(sf.GREETING + sf.encode([b"not a header", b"{}"]))
        d = sf.StreamDecoder(1 << 20)
        msgs: list[list[bytes]] = []
        while not msgs:
            msgs = d.feed(s.recv(4096))
        reply = fr.decode(msgs[0])
        assert reply.header.status != 0 and reply.params["error"] == "PROTOCOL_ERROR"
    with Admin(snode.stream_endpoint) as admin:
        assert admin.ping()["node"] == "node-1"


def test_a_client_pointed_at_a_zeromq_port_fails_clearly(snode):
    port = snode.endpoint.rsplit(":", 1)[1]
    with pytest.raises(FabricError):
        Admin(f"fabric://127.0.0.1:{port}", timeout_ms=1500).ping()


def test_clients_reconnect_after_kill9_and_nothing_acknowledged_is_lost(tmp_path):
    zport, sport = _free_port(), _free_port()
    args = {"listen": f"tcp://127.0.0.1:{zport}", "stream": f"fabric://127.0.0.1:{sport}"}
    node = Node(str(tmp_path / "d"), **args)
    ep = node.stream_endpoint
    try:
        with Admin(ep) as admin:
            admin.create_queue("r")
        producer = Producer(ep, linger_ms=1, request_timeout_ms=2000, delivery_timeout_ms=60_000)
        consumer = Consumer("r", ep, group="g", start="earliest", heartbeat_ms=300)
        acked = [producer.send("r", b"a%d" % i) for i in range(2000)]
        producer.flush()
        first = drain(consumer, 2000)
        consumer.commit()
        kill9(node)
        node = Node(str(tmp_path / "d"), **args)
        futures = [producer.send("r", b"b%d" % i) for i in range(2000)]
        producer.flush(60)
        assert all(f.result(1).offset is not None for f in futures)
        rest = drain(consumer, 2000, seconds=60)
        producer.close()
        consumer.close()
        values = [m.value for m in first + rest]
        assert [v for v in values if v.startswith(b"b")] == [b"b%d" % i for i in range(2000)]
        assert {f.result().offset for f in acked} <= set(range(4000))
    finally:
        node.stop()


def test_a_raw_request_over_the_stream(snode):
    """The wire as docs/protocol.md draws it: greeting, envelope, the usual frames."""
    host, port = sf.parse_endpoint(snode.stream_endpoint)
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(sf.GREETING + sf.encode(fr.encode(fr.Header(Op.PING, 7))))
        d = sf.StreamDecoder(1 << 20)
        msgs: list[list[bytes]] = []
        deadline = time.monotonic() + 5
        while not msgs and time.monotonic() < deadline:
            msgs = d.feed(s.recv(4096))
    reply = fr.decode(msgs[0])
    assert reply.header.request_id == 7 and reply.header.flags & fr.FLAG_REPLY
    assert reply.params["node"] == "node-1"


@pytest.mark.parametrize("stream", [True, False])
def test_linger_zero_sends_and_a_zero_timeout_poll(snode, stream):
    """linger_ms=0 writes each plain message at once (the direct path), offsets come back in
    order, and poll_batch(0) hands out what has arrived without ever waiting."""
    endpoint = snode.stream_endpoint if stream else snode.endpoint
    with Admin(endpoint) as admin:
        admin.create_queue("z", partitions=2)
    with Consumer("z", endpoint, start="earliest") as consumer:
        with Producer(endpoint, linger_ms=0) as producer:
            futures = [producer.send("z", b"%d" % i) for i in range(200)]
            metas = [f.result(10) for f in futures]
        # sticky partitioning moves on after every one-message batch: both partitions, in order
        for p in (0, 1):
            offs = [m.offset for m in metas if m.partition == p]
            assert offs == list(range(len(offs))) and offs
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < 200 and time.monotonic() < deadline:
            b = consumer.poll_batch(0)
            if b is None:
                time.sleep(0.001)
                continue
            got += b.values
    assert sorted(int(v) for v in got) == list(range(200))
