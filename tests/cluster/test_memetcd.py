"""MemoryEtcd keeps etcd's semantics: revisions, txn compares, leases, watches, outages."""

from __future__ import annotations

import pytest

from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.meta import Compare, Delete, Get, MetaUnavailable, Put, WatchCompacted


def test_revisions_create_mod_version() -> None:
    m = MemoryEtcd()
    assert m.revision == 1
    r1 = m.put("a", b"1")
    r2 = m.put("a", b"2")
    kv = m.get("a")
    assert (r1, r2) == (2, 3)
    assert kv is not None and (kv.create_revision, kv.mod_revision, kv.version) == (2, 3, 2)
    assert m.delete("a") == 1 and m.get("a") is None and m.revision == 4
    assert m.delete("a") == 0 and m.revision == 4  # deleting nothing is not a write
    m.put("a", b"3")
    kv = m.get("a")
    assert kv is not None and (kv.create_revision, kv.version) == (5, 1)


def test_get_prefix_sorted_with_revision() -> None:
    m = MemoryEtcd()
    for k in ("/x/b", "/x/a", "/y/a", "/x/c"):
        m.put(k, k.encode())
    kvs, rev = m.get_prefix("/x/")
    assert [kv.key for kv in kvs] == ["/x/a", "/x/b", "/x/c"] and rev == 5
    assert m.delete("/x/", prefix=True) == 3 and m.revision == 6
    assert m.get_prefix("/x/")[0] == [] and m.get("/y/a") is not None


@pytest.mark.parametrize(
    ("target", "op", "value", "expect"),
    [
        ("value", "==", b"v", True),
        ("value", "!=", b"v", False),
        ("value", "<", b"w", True),
        ("value", ">", b"w", False),
        ("create_revision", "==", 2, True),
        ("mod_revision", ">", 2, True),
        ("mod_revision", "<", 3, False),
        ("version", "==", 2, True),
        ("version", "!=", 2, False),
    ],
)
def test_txn_compares(target: str, op: str, value: bytes | int, expect: bool) -> None:
    m = MemoryEtcd()
    m.put("k", b"u")
    m.put("k", b"v")  # create 2, mod 3, version 2
    res = m.txn([Compare("k", target, op, value)], [Put("s", b"1")], [Put("f", b"1")])  # type: ignore[arg-type]
    assert res.succeeded is expect
    assert (m.get("s") is not None) is expect and (m.get("f") is not None) is not expect


def test_absent_key_compares_as_zero_but_value_compare_fails() -> None:
    m = MemoryEtcd()
    assert m.txn([Compare.absent("k")], [Put("k", b"1")]).succeeded
    assert not m.txn([Compare.absent("k")], [Put("k", b"2")]).succeeded
    assert not m.txn([Compare.value_is("nope", b"")], [Put("x", b"")]).succeeded
    assert m.txn([Compare("nope", "version", "==", 0)], []).succeeded


def test_txn_is_one_revision_and_gets_see_earlier_ops() -> None:
    m = MemoryEtcd()
    res = m.txn([], [Put("a", b"1"), Put("b", b"2"), Get("a"), Delete("zz")])
    assert res.revision == 2 and m.get("a").mod_revision == m.get("b").mod_revision == 2  # type: ignore[union-attr]
    assert [kv.value for kv in res.responses[2]] == [b"1"] and res.responses[3] == []
    ro = m.txn([], [Get("", prefix=True)])
    assert ro.revision == 2 and len(ro.responses[0]) == 2  # a read-only txn is not a write
    with pytest.raises(ValueError, match="duplicate key"):
        m.txn([], [Put("a", b"1"), Put("a", b"2")])


def test_lease_expiry_deletes_keys_in_one_revision() -> None:
    m = MemoryEtcd(now_ms=1000)
    lease = m.lease_grant(2)
    m.put("a", b"", lease)
    m.put("b", b"", lease)
    m.advance(2999)
    assert m.lease_keepalive(lease) == 2  # pushed to 4999
    assert m.advance(4998) == [] and m.get("a") is not None
    rev = m.revision
    assert m.advance(4999) == [lease]
    assert m.get("a") is None and m.get("b") is None and m.revision == rev + 1
    assert m.lease_keepalive(lease) == 0
    with pytest.raises(MetaUnavailable, match="lease not found"):
        m.put("c", b"", lease)


def test_put_without_lease_detaches_key() -> None:
    m = MemoryEtcd()
    lease = m.lease_grant(1)
    m.put("a", b"", lease)
    m.put("a", b"x")  # now without a lease
    m.lease_revoke(lease)
    assert m.get("a") is not None


def test_watch_from_revision_and_prefix() -> None:
    m = MemoryEtcd()
    m.put("/p/a", b"1")  # rev 2
    m.put("/q/a", b"1")  # rev 3
    w = m.watch("/p/", 2)
    m.put("/p/b", b"2")  # rev 4
    m.delete("/p/a")  # rev 5
    events = w.poll(0)
    assert [(e.type, e.kv.key, e.kv.mod_revision) for e in events] == [
        ("put", "/p/a", 2),
        ("put", "/p/b", 4),
        ("delete", "/p/a", 5),
    ]
    assert w.poll(0) == []
    m.put("/p/c", b"")
    assert [e.kv.key for e in w.poll(0)] == ["/p/c"]
    now = m.watch("/p/", 0)  # 0: from the next revision on
    assert now.poll(0) == []


def test_watch_compacted_by_bounded_history() -> None:
    m = MemoryEtcd(history_max=5)
    w = m.watch("/", 2)
    for i in range(20):
        m.put(f"/k{i}", b"")
    with pytest.raises(WatchCompacted):
        w.poll(0)
    with pytest.raises(WatchCompacted):
        w.poll(0)  # stays dead
    with pytest.raises(WatchCompacted):
        m.watch("/", 2).poll(0)
    assert [e.kv.key for e in m.watch("/", m.revision).poll(0)] == ["/k19"]


def test_explicit_compact() -> None:
    m = MemoryEtcd()
    for i in range(4):
        m.put(f"/k{i}", b"")  # revs 2..5
    m.compact(3)
    with pytest.raises(WatchCompacted):
        m.watch("/", 3).poll(0)
    assert [e.kv.mod_revision for e in m.watch("/", 4).poll(0)] == [4, 5]


def test_outage_fails_every_call_loses_watches_and_freezes_leases() -> None:
    m = MemoryEtcd()
    lease = m.lease_grant(1)
    m.put("a", b"", lease)
    w = m.watch("", 0)
    m.set_available(False)
    for call in (
        lambda: m.get("a"),
        lambda: m.get_prefix(""),
        lambda: m.put("a", b""),
        lambda: m.delete("a"),
        lambda: m.txn([], []),
        lambda: m.lease_grant(1),
        lambda: m.lease_keepalive(lease),
        lambda: m.lease_revoke(lease),
        lambda: m.watch("", 0),
        lambda: w.poll(0),
    ):
        with pytest.raises(MetaUnavailable):
            call()
    assert m.advance(60_000) == []  # no quorum, no expiry
    m.set_available(True)
    with pytest.raises(MetaUnavailable):
        w.poll(0)  # the watch was lost in the outage
    assert m.get("a") is not None  # the lease got its full ttl back
    assert m.advance(60_999) == [] and m.advance(61_000) == [lease]


def test_deterministic() -> None:
    def run() -> list[tuple[str, int]]:
        m = MemoryEtcd()
        leases = [m.lease_grant(t) for t in (1, 2, 3)]
        for i, lease in enumerate(leases):
            m.put(f"/l/{i}", b"", lease)
        m.advance(2500)
        return [(kv.key, kv.mod_revision) for kv in m.get_prefix("/")[0]] + [("rev", m.revision)]

    assert run() == run() == [("/l/2", 4), ("rev", 6)]
