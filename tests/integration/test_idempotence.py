"""The idempotent producer: a retried batch is stored once, a gap is refused, an old
epoch is fenced; across retries forced by a tiny request timeout and across a restart."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from fabric.client import Admin, Consumer, Producer
from fabric.errors import OutOfOrderSequence, ProducerFenced
from fabric.protocol.batch import encode_batch
from fabric.protocol.ops import Op
from fabric.testing import Node
from fabric.transport.connection import Connection
from tests.conftest import kill9

pytestmark = pytest.mark.integration


def _produce(conn: Connection, batch: bytes) -> int:
    return conn.request(Op.PRODUCE, {"queue": "idem", "partition": 0}, [batch]).params["offsets"][0]


def test_sequences_duplicates_gaps_and_fencing_survive_a_restart(tmp_path):
    data = str(tmp_path / "data")
    node = Node(data)
    try:
        conn = Connection(node.endpoint)
        conn.request(Op.CREATE_QUEUE, {"name": "idem"})
        ident = conn.request(Op.INIT_PRODUCER, {"name": "billing"}).params
        pid, epoch = ident["producer_id"], ident["epoch"]

        def batch(seq: int, n: int = 3, ep: int = epoch) -> bytes:
            return encode_batch(
                [b"m%d" % (seq + i) for i in range(n)], producer_id=pid, producer_epoch=ep, base_sequence=seq
            )

        assert _produce(conn, batch(0)) == 0
        assert _produce(conn, batch(3)) == 3
        assert _produce(conn, batch(0)) == 0  # a retry: the first offsets again, nothing stored
        with pytest.raises(OutOfOrderSequence):
            _produce(conn, batch(9))  # 6..8 are missing
        conn.close()
        kill9(node)
        node = Node(data)
        conn = Connection(node.endpoint)
        assert _produce(conn, batch(3)) == 3  # still known after kill -9 and restart
        assert _produce(conn, batch(6)) == 6
        newer = conn.request(Op.INIT_PRODUCER, {"name": "billing"}).params
        assert newer["producer_id"] == pid and newer["epoch"] == epoch + 1
        assert _produce(conn, batch(0, ep=newer["epoch"])) == 9
        with pytest.raises(ProducerFenced):
            _produce(conn, batch(9))  # the zombie with the old epoch
        assert conn.request(Op.DESCRIBE_QUEUE, {"name": "idem"}).params["messages"] == 12
        conn.close()
    finally:
        node.stop()


class ReplyDropper:
    """A proxy in front of the node that loses every 5th PRODUCE reply (real sockets), so the
    producer must send those batches again. One backend DEALER per client connection."""

    def __init__(self, node_endpoint: str) -> None:
        self.ctx = zmq.Context.instance()
        self.node_endpoint = node_endpoint
        self.front = self.ctx.socket(zmq.ROUTER)
        port = self.front.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        backs: dict[bytes, zmq.Socket] = {}
        owner: dict[zmq.Socket, bytes] = {}
        replies = 0
        while not self._stop.is_set():
            for sock, _ in poller.poll(50):
                if sock is self.front:
                    client, *frames = self.front.recv_multipart()
                    back = backs.get(client)
                    if back is None:
                        back = backs[client] = self.ctx.socket(zmq.DEALER)
                        back.connect(self.node_endpoint)
                        owner[back] = client
                        poller.register(back, zmq.POLLIN)
                    back.send_multipart(frames)
                else:
                    frames = sock.recv_multipart()
                    if frames[0][3] == Op.PRODUCE:
                        replies += 1
                        if replies % 5 == 0:
                            self.dropped += 1
                            continue
                    self.front.send_multipart([owner[sock], *frames])
        for back in backs.values():
            back.close(0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.front.close(0)


def test_lost_replies_are_retried_and_stored_once_in_order(node):
    with Admin(node.endpoint) as admin:
        admin.create_queue("retry", partitions=2)
    proxy = ReplyDropper(node.endpoint)
    n = 3000
    try:
        with Producer(proxy.endpoint, linger_ms=1, batch_bytes=2048, request_timeout_ms=300, retries=20) as p:
            futures = [p.send("retry", b"%06d" % i, key=b"%d" % (i % 5)) for i in range(n)]
            p.flush(60)
            offsets = [f.result(1) for f in futures]
            assert p.retried > 0 and proxy.dropped > 0, "no reply was lost: the test proves nothing"
    finally:
        proxy.close()
    assert len({(m.partition, m.offset) for m in offsets}) == n
    with Admin(node.endpoint) as admin:
        assert admin.describe_queue("retry")["messages"] == n  # no duplicates stored
    got = []
    with Consumer("retry", node.endpoint, start="earliest") as c:
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            got.extend(c.poll(200))
    values = [int(m.value) for m in got]
    assert sorted(values) == list(range(n))
    for k in range(5):  # per key (one partition each), the producer's order
        mine = [v for v in values if v % 5 == k]
        assert mine == sorted(mine)
