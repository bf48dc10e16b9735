"""The shared leader election (fabric.cluster.election) on the in-memory etcd."""

from __future__ import annotations

import logging

from fabric.cluster.election import Election
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.meta import Put

KEY = "/test/leader"
log = logging.getLogger(__name__)


def candidate(m: MemoryEtcd, name: str, events: list[str] | None = None) -> Election:
    return Election(
        m,
        KEY,
        name.encode(),
        role="leader",
        name=name,
        log=log,
        lease_ttl_s=3,
        on_won=None if events is None else lambda: events.append(f"{name} won"),
        on_step_down=None if events is None else lambda: events.append(f"{name} down"),
    )


def test_one_wins_the_other_waits_and_wins_with_a_higher_epoch_when_the_lease_expires() -> None:
    m = MemoryEtcd()
    events: list[str] = []
    a, b = candidate(m, "a", events), candidate(m, "b", events)
    a.step(0)
    b.step(0)
    assert a.epoch > 0 and b.epoch == 0 and b.lease == 0  # the loser revoked its try's lease
    kv = m.get(KEY)
    assert kv is not None and kv.value == b"a" and kv.lease == a.lease and kv.create_revision == a.epoch
    assert events == ["a won"]
    first = a.epoch
    for now in range(100, 2900, 100):  # a keeps its lease alive (every ttl/3), b keeps waiting
        m.advance(now)
        a.step(now)
        b.step(now)
    assert a.epoch == first and b.epoch == 0
    for now in range(3000, 7000, 100):  # a stops stepping (paused): its lease lapses, b takes over
        m.advance(now)
        b.step(now)
        if b.epoch:
            break
    assert b.epoch > first and now <= 2800 + 3000 + 750 + 100
    kv = m.get(KEY)
    assert kv is not None and kv.value == b"b" and kv.create_revision == b.epoch
    # a, back, finds its lease gone and steps down; its fenced write does not land
    assert not a.fenced_txn([], [Put("/test/data", b"from a")]).succeeded
    assert a.epoch == 0 and m.get("/test/data") is None
    assert events == ["a won", "b won", "a down"]
    assert b.fenced_txn([], [Put("/test/data", b"from b")]).succeeded


def test_a_step_down_lets_the_other_win_and_an_earlier_try_that_won_after_all_is_found() -> None:
    m = MemoryEtcd()
    a, b = candidate(m, "a"), candidate(m, "b")
    a.step(0)
    b.step(0)
    first = a.epoch
    assert first > 0 and b.epoch == 0
    m.lease_revoke(a.lease)  # a steps down cleanly (gives the lease up) ...
    a.step_down("resigned")
    assert a.epoch == 0 and a.lease == 0 and m.get(KEY) is None
    m.advance(750)
    b.step(750)  # ... and b wins on its next try
    assert b.epoch > first
    # keepalive finds the lease gone: b steps down, and campaigns again like any standby
    second = b.epoch
    m.lease_revoke(b.lease)
    m.advance(1750)
    b.step(1750)
    assert b.epoch > second
    a.step(1750)
    assert a.epoch == 0

    # a try whose answer was lost: the key is held under our own lease, so we won after all
    m2 = MemoryEtcd()
    c = candidate(m2, "c")
    c.lease = m2.lease_grant(3)
    m2.put(KEY, b"c", c.lease)
    c.step(0)
    kv = m2.get(KEY)
    assert kv is not None and c.epoch == kv.create_revision


def test_a_fenced_write_steps_down_when_the_key_is_not_ours() -> None:
    m = MemoryEtcd()
    a = candidate(m, "a")
    a.step(0)
    assert a.epoch
    m.delete(KEY)
    m.put(KEY, b"someone else")  # a newer incarnation of the key: a higher create_revision
    result = a.fenced_txn([], [Put("/test/data", b"x")])
    assert not result.succeeded and a.epoch == 0 and m.get("/test/data") is None
