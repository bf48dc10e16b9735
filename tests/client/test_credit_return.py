"""A consumer never waits for pushes while it owes the node credit (issue 15's "delivery that
recovers"): what it took while gathering a poll's batches is paid back before it blocks again.

A stream group member that fell behind once wedged here for good: its poll joined the batch it
popped with the pushes already waiting behind it, paid for the first only (credit goes back when a
batch is taken), and then waited with nothing held for a push the node, out of credit, would never
send."""

from __future__ import annotations

import time
from typing import Any

from fabric.client.consumer import Consumer
from fabric.protocol import frames as fr
from fabric.protocol.batch import encode_batch, stamp
from fabric.protocol.ops import Op

from .fake_router import FakeRouter

SUB = 7
WINDOW = 100


def _batch(base: int, n: int) -> bytes:
    buf = bytearray(encode_batch([b"v%d" % i for i in range(base, base + n)], first_timestamp=1))
    stamp(buf, base)
    return bytes(buf)


class PushingNode(FakeRouter):
    """Answers SUBSCRIBE, then pushes two 60-record batches into a 100-message window (the second
    goes alone past the credit left, as a node does) and waits for credit; records every grant."""

    def __init__(self, pushes: tuple[tuple[int, int], ...] = ((0, 60), (60, 60))) -> None:
        super().__init__()
        self.credited: list[int] = []
        self.pushes = pushes  # (base offset, records) of each batch pushed on SUBSCRIBE

    def _serve(self) -> None:
        deadline = time.monotonic() + 20
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.sock.poll(50):
                ident, *frames = self.sock.recv_multipart()
                self._handle(ident, fr.decode(frames))

    def _handle(self, ident: bytes, msg: fr.Message) -> None:
        h = msg.header
        if h.op == Op.SUBSCRIBE:
            self.reply(ident, h, {"subscription": SUB, "partitions": {"0": 0}, "generation": 0})
            for base, n in self.pushes:
                self._push(ident, base, n)
        elif h.op == Op.CREDIT:
            self.credited.append(int(msg.params["messages"]))
        elif h.op in (Op.UNSUBSCRIBE, Op.HEARTBEAT):
            self.reply(ident, h, {"subscriptions": [SUB]} if h.op == Op.HEARTBEAT else {})

    def _push(self, ident: bytes, base: int, n: int) -> None:
        header = fr.Header(Op.PUSH, SUB, fr.FLAG_EVENT)
        params: dict[str, Any] = {"partition": 0, "high_watermark": base + n}
        self.sock.send_multipart([ident, *fr.encode(header, params, [_batch(base, n)])])


def test_what_a_poll_gathered_is_paid_for_before_the_consumer_waits_again() -> None:
    node = PushingNode()
    node.start()
    try:
        c = Consumer("q", node.endpoint, start="earliest", credit_messages=WINDOW, auto_commit=False)
        try:
            time.sleep(0.3)  # both pushes are here before the first poll
            got = c.poll(1000)
            assert [m.offset for m in got] == list(range(120))
            assert c.poll(300) == []  # nothing more: the node is out of credit until it is paid
            deadline = time.monotonic() + 2
            while sum(node.credited) < 120 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert sum(node.credited) == 120, f"granted {node.credited}: the consumer waits owing credit"
        finally:
            c.close()
    finally:
        node.stop()


def test_poll_batch_joins_what_piled_up_behind_it_up_to_the_credit_window() -> None:
    """A consumer behind its pushes (it commits after every poll, say) takes what piled up in one
    poll_batch, contiguous records of the partition up to credit_messages, not one pushed batch
    per poll; poll() still returns at most 1,000 messages beyond its first batch."""
    node = PushingNode(tuple((i * 3000, 3000) for i in range(5)))
    node.start()
    try:
        c = Consumer("q", node.endpoint, start="earliest", credit_messages=10_000, auto_commit=False)
        try:
            time.sleep(0.5)  # all five pushes are here before the first poll
            got = []
            while sum(n for _, n in got) < 15_000:
                b = c.poll_batch(1000)
                assert b is not None
                assert b.values == [b"v%d" % i for i in range(b.base_offset, b.base_offset + len(b.values))]
                got.append((b.base_offset, len(b.values)))
            assert got == [(0, 9000), (9000, 6000)]
        finally:
            c.close()
    finally:
        node.stop()


def test_poll_batch_joins_thousands_of_one_record_pushes() -> None:
    """A producer with linger_ms=0 makes one-record batches: a consumer behind them takes them
    joined, in order, up to credit_messages a poll."""
    node = PushingNode(tuple((i, 1) for i in range(3000)))
    node.start()
    try:
        c = Consumer("q", node.endpoint, start="earliest", credit_messages=2000, auto_commit=False)
        try:
            time.sleep(1.5)  # the pushes are here before the first poll (1.5 s: a loaded machine)
            deadline = time.monotonic() + 10
            got: list[tuple[int, int]] = []
            while sum(n for _, n in got) < 3000 and time.monotonic() < deadline:
                b = c.poll_batch(1000)
                if b is not None:
                    assert b.values == [b"v%d" % i for i in range(b.base_offset, b.base_offset + len(b.values))]
                    got.append((b.base_offset, len(b.values)))
            assert sum(n for _, n in got) == 3000 and got[0] == (0, 2000)
        finally:
            c.close()
    finally:
        node.stop()


class RevokingNode(PushingNode):
    """A coordinator that assigns partition 0, pushes one batch of it, and at once revokes it (an
    ASSIGNMENT event right behind the push); it answers COMMIT and REVOKED, and keeps them."""

    def __init__(self) -> None:
        super().__init__(pushes=((0, 100),))
        self.seen: list[tuple[int, dict[str, Any]]] = []

    def _handle(self, ident: bytes, msg: fr.Message) -> None:
        h = msg.header
        self.seen.append((h.op, msg.params))
        if h.op in (Op.SUBSCRIBE, Op.CREDIT, Op.HEARTBEAT):
            super()._handle(ident, msg)
            if h.op == Op.SUBSCRIBE:
                event = fr.Header(Op.ASSIGNMENT, SUB, fr.FLAG_EVENT)
                assignment = {"generation": 1, "revoked": [0], "assigned": {}}
                self.sock.send_multipart([ident, *fr.encode(event, assignment)])
        elif not h.flags & fr.FLAG_NO_REPLY:
            self.reply(ident, h, {})


def test_a_poll_never_hands_out_a_partition_revoked_while_it_gathered() -> None:
    """The push arrives, then the revocation: the poll that popped the pushed batch learns of the
    revocation while picking up what else arrived, and hands out nothing of that partition (it is
    another member's now); the consumer gave the partition back without committing past what it
    had handed out."""
    node = RevokingNode()
    node.start()
    try:
        c = Consumer("q", node.endpoint, group="g", credit_messages=1000, auto_commit=False)
        try:
            assert c.coordinated and c.assignment() == [0]
            time.sleep(0.5)  # the push and the assignment are both here before the first poll
            assert c.poll_batch(300) is None
            assert c.poll_batch(300) is None and c.assignment() == []
            ops = [op for op, _ in node.seen]
            assert Op.REVOKED in ops
            commits = [params for op, params in node.seen if op == Op.COMMIT]
            assert all(params["offsets"] == {"0": 0} for params in commits)
        finally:
            c.close()
    finally:
        node.stop()
