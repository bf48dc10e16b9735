"""The cluster's ACL and quota documents in etcd (fabric/cluster/policy.py): pure merges, the
compare-and-swap that keeps concurrent writers from losing each other's rules, and the poll."""

from __future__ import annotations

import json

import pytest

from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.meta import MetaUnavailable
from fabric.cluster.policy import ACLS_KEY, QUOTAS_KEY, Policy, merge_acl, merge_quota, parse_rules

ALICE = {"principal": "alice", "operation": "produce", "resource": "orders"}
BOB = {"principal": "bob", "operation": "consume", "resource": "group:b*"}


def test_merge_acl_adds_and_removes_once() -> None:
    doc, changed, n = merge_acl(None, ALICE, add=True)
    assert changed and n == 1 and parse_rules(doc) == [ALICE]
    assert merge_acl(doc, ALICE, add=True) == (None, False, 1)  # there already: nothing to write
    doc2, changed, n = merge_acl(doc, BOB, add=True)
    assert parse_rules(doc2) == [ALICE, BOB]
    doc3, changed, n = merge_acl(doc2, ALICE, add=False)
    assert changed and n == 1 and parse_rules(doc3) == [BOB]
    assert merge_acl(doc3, ALICE, add=False) == (None, False, 1)
    assert parse_rules(b"not json") == [] and parse_rules(b'{"rules": [{"principal": 1}, "x"]}') == []


def test_merge_quota_replaces_its_target() -> None:
    q = {"target": "principal:alice", "messages_per_s": 10, "bytes_per_s": 0, "burst_ms": 1000}
    doc = merge_quota(None, q)
    assert merge_quota(doc, q) is None
    doc2 = merge_quota(doc, {**q, "messages_per_s": 0})  # 0/0 stays: it overrides the config's
    assert json.loads(doc2)["quotas"] == [{**q, "messages_per_s": 0}]


def test_concurrent_writers_do_not_lose_each_others_rules() -> None:
    meta = MemoryEtcd()
    b = Policy(meta)
    raced: list[object] = []

    class Racing:  # node A's view of etcd: node B writes between A's read and A's compare-and-swap
        def get(self, key: str):  # type: ignore[no-untyped-def]
            kv = meta.get(key)
            if not raced:
                raced.append(b.change_acl(BOB, add=True))
            return kv

        def txn(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return meta.txn(*args, **kwargs)

    rules, changed = Policy(Racing()).change_acl(ALICE, add=True)  # type: ignore[arg-type]
    assert changed and raced == [([BOB], True)]
    assert sorted(map(str, rules)) == sorted(map(str, [ALICE, BOB]))
    assert sorted(map(str, parse_rules(meta.get(ACLS_KEY).value))) == sorted(map(str, [ALICE, BOB]))


def test_a_writer_that_never_wins_gives_up() -> None:
    meta = MemoryEtcd()
    p = Policy(meta)
    meta.txn = lambda compares, puts, *a, **k: type("R", (), {"succeeded": False})()  # type: ignore[method-assign]
    with pytest.raises(MetaUnavailable, match="retry"):
        p.change_acl(ALICE, add=True)


def test_poll_reports_what_moved() -> None:
    meta = MemoryEtcd()
    writer, reader = Policy(meta), Policy(meta)
    assert reader.poll(0) == ([], [])  # first look: nothing there yet
    assert reader.poll(100) == (None, None)  # not due
    assert reader.poll(1000) == (None, None)  # due, unchanged
    writer.change_acl(ALICE, add=True)
    assert reader.poll(2000) == ([ALICE], None)
    writer.set_quota({"target": "queue:orders", "messages_per_s": 5, "bytes_per_s": 0, "burst_ms": 1000})
    rules, quotas = reader.poll(3000)
    assert rules is None and quotas is not None and quotas[0]["target"] == "queue:orders"
    assert meta.get(QUOTAS_KEY) is not None
