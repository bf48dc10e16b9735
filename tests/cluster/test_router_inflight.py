"""The router's table of forwarded requests (fabric/router/inflight.py), in memory."""

from __future__ import annotations

from fabric.router import inflight as inf
from fabric.router.inflight import InFlight


def test_a_reply_takes_its_request_out_once() -> None:
    t = InFlight()
    t.sent("n1", (b"c", 1), b"h" * 16, ("q", 0), 0.0)
    assert t.size == 1 and t.waiting("n1") == 1
    assert t.answered("n1", (b"c", 1))
    assert not t.answered("n1", (b"c", 1))  # a second reply: not waiting any more
    assert not t.answered("n2", (b"c", 2))
    assert t.size == 0


def test_a_lost_link_returns_everything_sent_there_and_only_that() -> None:
    t = InFlight()
    for rid in range(5):
        t.sent("n1", (b"c", rid), b"h" * 16, ("q", rid % 2), 0.0)
    t.sent("n2", (b"c", 99), b"h" * 16, None, 0.0)
    lost = t.lost("n1")
    assert sorted(k[1] for k, _ in lost) == [0, 1, 2, 3, 4]
    assert t.size == 1 and t.lost("n1") == []
    assert t.answered("n2", (b"c", 99))


def test_a_moved_leadership_returns_only_that_partitions_requests() -> None:
    t = InFlight()
    t.sent("n1", (b"a", 1), b"h" * 16, ("q", 0), 0.0)
    t.sent("n1", (b"a", 2), b"h" * 16, ("q", 1), 0.0)
    t.sent("n1", (b"a", 3), b"h" * 16, None, 0.0)  # not sent to a leader: the map cannot move it
    t.sent("n2", (b"b", 1), b"h" * 16, ("q", 2), 0.0)
    leaders = {("q", 0): "n2", ("q", 1): "n1", ("q", 2): None}
    moved = t.moved(lambda q, p: leaders.get((q, p)))
    assert sorted((n, k) for n, k, _ in moved) == [("n1", (b"a", 1)), ("n2", (b"b", 1))]
    assert t.size == 2
    assert t.moved(lambda q, p: leaders.get((q, p))) == []


def test_old_requests_expire_and_the_table_is_bounded(monkeypatch) -> None:
    t = InFlight()
    t.sent("n1", (b"c", 1), b"h" * 16, None, 0.0)
    t.sent("n1", (b"c", 2), b"h" * 16, None, 100.0)
    assert [k for k, _ in t.expired(130.0, limit_s=120.0)] == [(b"c", 1)]
    assert t.size == 1
    monkeypatch.setattr(inf, "ENTRIES_MAX", 2)
    assert not t.full()
    t.sent("n1", (b"c", 3), b"h" * 16, None, 0.0)
    assert t.full()
    t.sent("n1", (b"c", 3), b"h" * 16, None, 0.0)  # the same request again: counted once
    assert t.size == 2
