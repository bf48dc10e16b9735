"""A SUBSCRIBE that gets no answer (its coordinator died a moment ago, or the connection failed
over with it in flight) is sent again within the consumer's timeout, not waited on to the end."""

from __future__ import annotations

import itertools
import threading
import time

import zmq

from fabric.client.consumer import Consumer
from fabric.errors import NotLeader
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op

from .fake_router import FakeRouter


def _node(router: zmq.Socket, seen: list[float], stop: threading.Event) -> None:
    """Ignores the first SUBSCRIBE, answers the next; answers UNSUBSCRIBE; ignores the rest."""
    while not stop.is_set():
        if not router.poll(50):
            continue
        ident, *frames = router.recv_multipart()
        header = fr.decode_header(frames[0])
        if header.op == Op.SUBSCRIBE:
            seen.append(time.monotonic())
            if len(seen) == 1:
                continue
            params = {"subscription": 7, "partitions": {"0": 0}, "generation": 0}
        elif header.op == Op.UNSUBSCRIBE:
            params = {}
        else:
            continue
        router.send_multipart([ident, *fr.encode(fr.Header(header.op, header.request_id, fr.FLAG_REPLY), params)])


def test_an_unanswered_subscribe_is_sent_again_within_the_timeout() -> None:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    seen: list[float] = []
    stop = threading.Event()
    peer = threading.Thread(target=_node, args=(router, seen, stop), daemon=True)
    peer.start()
    try:
        t0 = time.monotonic()
        with Consumer("q", f"tcp://127.0.0.1:{port}", group="g", timeout_ms=3000, auto_commit=False) as c:
            assert c.assignment() == [0]
        assert len(seen) == 2
        assert 0.9 <= seen[1] - seen[0] <= 2.0  # a third of the timeout, then again
        assert time.monotonic() - t0 < 3.0
    finally:
        stop.set()
        peer.join(5)
        router.close(0)


class RefusingNode(FakeRouter):
    """Answers the first ``refusals`` SUBSCRIBEs NOT_LEADER (a router that reaches no storage node
    yet), then a subscription; answers UNSUBSCRIBE; ignores the rest. Stops by itself in 20 s."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals
        self.seen: list[float] = []  # when each SUBSCRIBE came
        self.start()

    def _serve(self) -> None:
        for ident, header in self.requests(20):
            if header.op == Op.UNSUBSCRIBE:
                self.reply(ident, header, {})
            elif header.op == Op.SUBSCRIBE:
                self.seen.append(time.monotonic())
                if len(self.seen) <= self.refusals:
                    refusal = {"error": "NOT_LEADER", "message": "no storage node is reachable yet; retry"}
                    self.reply(ident, header, refusal, NotLeader.code)
                else:
                    self.reply(ident, header, {"subscription": 7, "partitions": {"0": 0}, "generation": 0})
        self.sock.close(0)


def _subscribe_against(refusals: int, timeout_ms: int) -> tuple[object, list[float]]:
    node = RefusingNode(refusals)
    try:
        with Consumer("q", node.endpoint, group="g", timeout_ms=timeout_ms, auto_commit=False) as c:
            result: object = c.assignment()
    except Exception as exc:
        result = exc
    finally:
        node.stop()
    return result, node.seen


def test_a_subscribe_refused_not_leader_is_asked_again_with_backoff() -> None:
    """Nothing was done (a router with no storage node yet, as a cluster starts): the consumer's
    constructor asks again, 50 ms then doubling, instead of failing."""
    result, seen = _subscribe_against(3, 5000)
    assert result == [0]
    assert len(seen) == 4
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert gaps[0] >= 0.04 and gaps[2] >= 0.15


def test_not_leader_past_the_timeout_is_raised() -> None:
    result, seen = _subscribe_against(1000, 600)
    assert isinstance(result, NotLeader)
    assert 2 <= len(seen) <= 6
