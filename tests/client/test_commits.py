"""A consumer's commits on their way: replies matched in any order, a refusal raised once by the
next commit, a wait bounded by the number unanswered and by time, a lost link forgetting them
(fabric/client/commits.py, in memory)."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from fabric.client.commits import PendingCommits
from fabric.client.consumer import Consumer
from fabric.errors import BadParameter, NotCoordinator, Timeout
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op

from .fake_router import FakeRouter


def _reply(rid: int, status: int = 0, message: str = "") -> fr.Message:
    params = {"message": message} if status else {}
    return fr.Message(fr.Header(int(Op.COMMIT), rid, 0, status), params, [])


class FakeConn:
    """What PendingCommits reads of a connection: queued messages, set-aside replies, the link."""

    def __init__(self) -> None:
        self.events: deque[fr.Message] = deque()
        self.incoming: deque[fr.Message] = deque()
        self.stray: dict[int, fr.Message] = {}
        self.gen = 0

    def recv(self, timeout_ms: int) -> fr.Message | None:
        return self.incoming.popleft() if self.incoming else None

    def take_reply(self, rid: int) -> fr.Message | None:
        return self.stray.pop(rid, None)

    def generation(self) -> int:
        return self.gen


def test_replies_are_matched_and_a_refusal_is_raised_once() -> None:
    c = PendingCommits()
    for rid in (1, 2, 3):
        c.sent(rid, 0)
    assert c.on_reply(_reply(2, NotCoordinator.code, "not the coordinator"))
    assert not c.on_reply(_reply(9))  # an auto-commit's reply: not one of these
    assert c.on_reply(_reply(1))
    assert list(c.unanswered) == [3]
    with pytest.raises(NotCoordinator, match="not the coordinator"):
        c.raise_refused()
    c.raise_refused()  # told once


def test_wait_reads_until_few_enough_are_unanswered() -> None:
    c, conn = PendingCommits(), FakeConn()
    for rid in (1, 2, 3):
        c.sent(rid, 0)
    conn.stray[1] = _reply(1)  # read while another request waited
    seen: list[Any] = []

    def on_message(msg: fr.Message) -> None:
        seen.append(msg.header.request_id)
        c.on_reply(msg)

    push = fr.Message(fr.Header(int(Op.PUSH), 7, fr.FLAG_EVENT), {}, [])
    conn.incoming.extend([push, _reply(2), _reply(3)])
    c.wait(conn, on_message, 1, 1000)  # type: ignore[arg-type]
    assert list(c.unanswered) == [3] and seen == [7, 2]  # the push went to the consumer on the way
    c.wait(conn, on_message, 0, 1000)  # type: ignore[arg-type]
    assert not c.unanswered


def test_wait_gives_up_on_time_and_forgets_what_a_lost_link_took() -> None:
    c, conn = PendingCommits(), FakeConn()
    c.sent(1, 0)
    with pytest.raises(Timeout):
        c.wait(conn, lambda m: None, 0, 1)  # type: ignore[arg-type]
    conn.gen = 1  # the link was lost: no reply will come
    c.wait(conn, lambda m: None, 0, 1000)  # type: ignore[arg-type]
    assert not c.unanswered


class RefusingNode(FakeRouter):
    """A group's node that answers SUBSCRIBE and HEARTBEAT and refuses every COMMIT."""

    def _serve(self) -> None:
        for ident, h in self.requests(20):
            if h.op == Op.SUBSCRIBE:
                self.reply(ident, h, {"subscription": 3, "partitions": {"0": 0}, "generation": 0})
            elif h.op == Op.HEARTBEAT:
                self.reply(ident, h, {"subscriptions": [3]})
            elif h.op == Op.COMMIT:
                self.reply(ident, h, {"error": "BAD_PARAMETER", "message": "no"}, BadParameter.code)
            elif not h.flags & fr.FLAG_NO_REPLY:
                self.reply(ident, h, {})


def test_commit_with_wait_raises_the_refusal_itself() -> None:
    """commit(wait=True) is the synchronous form: the reply is awaited and a refusal raised by
    that very call; commit() without it raises it from the next commit()."""
    node = RefusingNode()
    node.start()
    try:
        c = Consumer("q", node.endpoint, group="g", start="earliest", auto_commit=False)
        try:
            with pytest.raises(BadParameter):
                c.commit(wait=True)
            c.commit()  # sent; its refusal comes with the next commit
            with pytest.raises(BadParameter):
                c.commit(wait=True)
        finally:
            c.close()
    finally:
        node.stop()
