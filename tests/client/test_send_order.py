"""An idempotent producer's ready batches behind a full window: a partition whose replies are slow
holds back only its own batches, never another partition's, and its own go as soon as replies
make room (the producer remembers a stuck head instead of asking every batch again, so this is
what that memory must not break). A fake node: a ROUTER on 127.0.0.1 that describes a queue of
two partitions, gives a producer id, and answers PRODUCE for partition 1 at once and for
partition 0 only when the test lets it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from fabric.client.producer import Producer
from fabric.errors import Timeout
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op

from .fake_router import FakeRouter


class SlowPartitionNode(FakeRouter):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()  # partition 0's replies may go
        self.held: list[tuple[bytes, fr.Header, int]] = []
        self.next_offset = {0: 0, 1: 0}
        self.produced: list[tuple[int, float]] = []  # (partition, when)
        self.start()

    def _serve(self) -> None:
        deadline = time.monotonic() + 30
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.release.is_set() and self.held:
                for ident, h, offset in self.held:
                    self.reply(ident, h, {"offsets": [offset]})
                self.held.clear()
            if not self.sock.poll(10):
                continue
            ident, *frames = self.sock.recv_multipart()
            msg = fr.decode(frames)
            h = msg.header
            if h.op == Op.DESCRIBE_QUEUE:
                settings = {"max_message_bytes": 1 << 20, "max_batch_bytes": 4 << 20}
                self.reply(ident, h, {"name": msg.params["name"], "partitions": 2, "settings": settings})
            elif h.op == Op.INIT_PRODUCER:
                self.reply(ident, h, {"producer_id": 7, "epoch": 0})
            elif h.op == Op.PRODUCE:
                p = msg.params["partition"]
                offset = self.next_offset[p]
                self.next_offset[p] += 1  # one record per batch in these tests
                self.produced.append((p, time.monotonic()))
                if p == 0 and not self.release.is_set():
                    self.held.append((ident, h, offset))
                else:
                    self.reply(ident, h, {"offsets": [offset]})
            elif not h.flags & fr.FLAG_NO_REPLY:
                self.reply(ident, h, {})
        self.sock.close(0)


@pytest.fixture
def node() -> Iterator[SlowPartitionNode]:
    n = SlowPartitionNode()
    yield n
    n.stop()


def test_a_partition_behind_a_full_window_holds_back_only_its_own_batches(node: SlowPartitionNode) -> None:
    big = b"x" * 2000  # past batch_bytes: every value is a batch of its own, sealed into the ready queue
    with Producer(node.endpoint, linger_ms=0.5, batch_bytes=1024, request_timeout_ms=20_000) as p:
        slow = [p.send("q", big, partition=0) for i in range(40)]
        time.sleep(0.3)  # partition 0's window (5 batches) is in flight, the other 35 wait in order
        assert sum(1 for part, _ in node.produced if part == 0) == 5
        fast = []
        for i in range(3):  # each sealed behind the stuck ones, each goes at once
            fast.append(p.send("q", big, partition=1))
            assert fast[-1].result(5).offset == i
        assert not any(f.done() for f in slow)
        node.release.set()  # room in partition 0's window: its batches go, in order, all of them
        assert [f.result(10).offset for f in slow] == list(range(40))
    assert [part for part, _ in node.produced].count(0) == 40


def test_a_full_buffer_blocks_senders_until_it_drains_then_lets_them_go(node: SlowPartitionNode) -> None:
    """Back-pressure: past ``buffer_bytes`` a send blocks (``max_block_ms``, then Timeout); once
    replies drain the buffer the blocked sender goes on, and nothing is lost or reordered."""
    big = b"x" * 2000
    with Producer(node.endpoint, linger_ms=0.5, batch_bytes=1024, buffer_bytes=16 * 1024, max_block_ms=400) as p:
        futures = []
        with pytest.raises(Timeout):  # the send that finds the buffer full was not taken
            for _ in range(100):
                futures.append(p.send("q", big, partition=0))
        assert 8 <= len(futures) <= 10  # about buffer_bytes worth
        sent_at = time.monotonic()
        blocked: list[float] = []

        def sender() -> None:
            p.max_block_s = 10.0
            futures.append(p.send("q", big, partition=0))
            blocked.append(time.monotonic() - sent_at)

        t = threading.Thread(daemon=True, target=sender)
        t.start()
        time.sleep(0.3)
        assert not blocked  # still waiting for room
        node.release.set()
        t.join(10)
        assert blocked and blocked[0] < 5
        assert [f.result(10).offset for f in futures] == list(range(len(futures)))
