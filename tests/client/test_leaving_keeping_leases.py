"""A queue member leaving with ``keep_leases`` (``fabric recv --no-ack``) keeps leased only what
its application was handed: what the node pushed while it was leaving (those pushes arrive before
the UNSUBSCRIBE reply) goes back at once, uncounted, by receipt (SETTLE nack)."""

from __future__ import annotations

import time
from typing import Any

from fabric.client.consumer import Consumer
from fabric.protocol import frames as fr
from fabric.protocol.batch import encode_batch, stamp
from fabric.protocol.ops import Op

from .fake_router import FakeRouter

SUB = 9


def _batch(base: int, n: int) -> bytes:
    buf = bytearray(encode_batch([b"v%d" % i for i in range(base, base + n)], first_timestamp=1))
    stamp(buf, base)
    return bytes(buf)


class LeasingNode(FakeRouter):
    """Leases offsets 0..9 on SUBSCRIBE; on UNSUBSCRIBE pushes 10..14 first (it took the CREDIT
    that came before), then replies; answers SETTLE and keeps every request's params."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, dict[str, Any]]] = []

    def _serve(self) -> None:
        deadline = time.monotonic() + 20
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.sock.poll(50):
                ident, *frames = self.sock.recv_multipart()
                msg = fr.decode(frames)
                h = msg.header
                self.seen.append((h.op, msg.params))
                if h.op == Op.SUBSCRIBE:
                    self.reply(ident, h, {"subscription": SUB, "partitions": {"0": 0}, "generation": 0})
                    self._push(ident, 0, 10)
                elif h.op == Op.UNSUBSCRIBE:
                    self._push(ident, 10, 5)
                    self.reply(ident, h, {"released": 0})
                elif h.op == Op.HEARTBEAT:
                    self.reply(ident, h, {"subscriptions": [SUB]})
                elif h.op == Op.SETTLE:
                    self.reply(ident, h, {"settled": 5})
                elif not h.flags & fr.FLAG_NO_REPLY:
                    self.reply(ident, h, {})

    def _push(self, ident: bytes, base: int, n: int) -> None:
        header = fr.Header(Op.PUSH, SUB, fr.FLAG_EVENT)
        params: dict[str, Any] = {"partition": 0, "high_watermark": base + n, "leases": [[base, base + n, 1]]}
        self.sock.send_multipart([ident, *fr.encode(header, params, [_batch(base, n)])])


def test_pushes_that_arrive_while_leaving_go_back_uncounted() -> None:
    node = LeasingNode()
    node.start()
    try:
        c = Consumer("q", node.endpoint, group="w", kind="queue", auto_commit=False)
        try:
            assert [m.offset for m in c.poll(2000)] == list(range(10))
        finally:
            c.close(keep_leases=True)
        unsub = [p for op, p in node.seen if op == Op.UNSUBSCRIBE]
        settle = [p for op, p in node.seen if op == Op.SETTLE]
        assert len(unsub) == 1 and unsub[0]["keep_leases"] is True
        assert unsub[0]["release"] is None  # the application was handed all of 0..9: they stay leased
        assert len(settle) == 1, node.seen
        assert settle[0]["action"] == "nack" and settle[0]["uncount"] is True
        assert settle[0]["member"] == SUB and settle[0]["group"] == "w" and settle[0]["queue"] == "q"
        assert settle[0]["ranges"] == {"0": [[10, 15]]}
    finally:
        node.stop()
