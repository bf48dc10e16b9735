"""The stream transport (fabric://) against a real node process: same API, same guarantees."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import FabricError, MessageTooLarge, UnknownQueue
from fabric.protocol import frames as fr
from fabric.protocol import stream as sf
from fabric.protocol.ops import Op
from fabric.testing import Node
from fabric.transport import stream_client
from fabric.transport.stream_client import StreamConnection
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


def _raw_ping(s: socket.socket, request_id: int) -> fr.Message:
    """A PING written by hand (greeting, envelope, frames) and its reply, read by hand."""
    s.sendall(sf.GREETING + sf.encode(fr.encode(fr.Header(Op.PING, request_id))))
    d = sf.StreamDecoder(1 << 20)
    msgs: list[list[bytes]] = []
    deadline = time.monotonic() + 5
    while not msgs and time.monotonic() < deadline:
        msgs = d.feed(s.recv(4096))
    return fr.decode(msgs[0])


def test_a_raw_request_over_the_stream(snode):
    """The wire as docs/protocol.md draws it: greeting, envelope, the usual frames."""
    host, port = sf.parse_endpoint(snode.stream_endpoint)
    with socket.create_connection((host, port), timeout=5) as s:
        reply = _raw_ping(s, 7)
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


def _request_ping(conn: StreamConnection) -> str:
    return str(conn.request(Op.PING, {}, timeout_ms=5000).params["node"])


def test_a_client_on_the_same_host_takes_the_unix_socket_and_tcp_serves_the_same(snode, monkeypatch):
    """A loopback fabric:// endpoint: the client connects to the node's abstract Unix socket
    first; with the shortcut off it uses TCP; both see the same node and the same log."""
    conn = StreamConnection(snode.stream_endpoint)
    try:
        assert _request_ping(conn) == "node-1" and conn.local
    finally:
        conn.close()
    monkeypatch.setattr(stream_client, "LOCAL_SHORTCUT", False)
    conn = StreamConnection(snode.stream_endpoint)
    try:
        assert _request_ping(conn) == "node-1" and not conn.local
    finally:
        conn.close()
    with Admin(snode.stream_endpoint) as admin:
        admin.create_queue("u")
    with Producer(snode.stream_endpoint, linger_ms=0) as producer:  # TCP (shortcut off here)
        producer.send("u", b"over tcp").result(10)
    monkeypatch.setattr(stream_client, "LOCAL_SHORTCUT", True)
    with Producer(snode.stream_endpoint, linger_ms=0) as producer:
        producer.send("u", b"over unix").result(10)
    with Consumer("u", snode.stream_endpoint, start="earliest") as consumer:
        got = drain(consumer, 2)
    assert [m.value for m in got] == [b"over tcp", b"over unix"]


def test_the_unix_socket_speaks_the_documented_wire(snode):
    """The same greeting and envelope as over TCP (docs/protocol.md)."""
    host, port = sf.parse_endpoint(snode.stream_endpoint)
    name = sf.local_address(host, port)
    assert name is not None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(name)
        reply = _raw_ping(s, 9)
    assert reply.header.request_id == 9 and reply.params["node"] == "node-1"


def _forward(listener: socket.socket, target: tuple[str, int], stop: threading.Event) -> None:
    """A TCP proxy for one connection (both directions), until either side closes or ``stop``."""
    listener.settimeout(5)
    try:
        a, _ = listener.accept()
    except OSError:
        return
    b = socket.create_connection(target, timeout=5)

    def pump(src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        while not stop.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            dst.sendall(data)
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    t = threading.Thread(target=pump, args=(b, a), daemon=True)
    t.start()
    pump(a, b)
    t.join(5)
    a.close()
    b.close()


def test_a_loopback_port_with_no_unix_socket_behind_it_is_reached_over_tcp(snode):
    """A proxy (or a node of an older version) on a loopback port has no same-host socket under
    that port's name: the client falls back to TCP and works as before."""
    host, port = sf.parse_endpoint(snode.stream_endpoint)
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        proxy_port = listener.getsockname()[1]
        t = threading.Thread(target=_forward, args=(listener, (host, port), stop), daemon=True)
        t.start()
        conn = StreamConnection(f"fabric://127.0.0.1:{proxy_port}")
        try:
            assert _request_ping(conn) == "node-1" and not conn.local
        finally:
            conn.close()
            stop.set()
            t.join(10)
