"""EtcdClient against real etcd 3.4 members (the shared ``etcd_cluster``), and its failure paths
against tiny fake members. Keys are unique per test: the cluster lives for the whole run."""

from __future__ import annotations

import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from fabric.cluster import etcd_members
from fabric.cluster.etcd import EtcdClient, parse_endpoint, prefix_end
from fabric.cluster.etcd_members import EtcdMemberSpec
from fabric.cluster.meta import Compare, Delete, Get, LeaseNotFound, MetaUnavailable, Put, WatchCompacted, WatchEvent
from fabric.errors import ConfigError
from tests.etcd_fixture import free_ports


@pytest.fixture
def prefix() -> str:
    return f"/t/{uuid.uuid4().hex[:10]}/"


@pytest.fixture
def client(etcd_cluster) -> Iterator[EtcdClient]:
    c = EtcdClient(etcd_cluster.endpoints, timeout_s=2.0)
    yield c
    c.close()


def wait_for(cond: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def drain(watch, n: int, seconds: float = 5.0) -> list[WatchEvent]:
    got: list[WatchEvent] = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        got.extend(watch.poll(0.2))
    return got


# -- KV and transactions -------------------------------------------------------------------------


@pytest.mark.cluster
def test_get_put_delete_and_prefix(client, prefix):
    assert client.get(prefix + "a") is None
    r1 = client.put(prefix + "a", b"1")
    r2 = client.put(prefix + "b", b"\x00\xff binary")
    client.put(prefix[:-1] + "0", b"just outside the prefix")
    assert r2 > r1 > 0
    kv = client.get(prefix + "a")
    assert kv is not None and (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"1", r1, r1, 1)
    r3 = client.put(prefix + "a", b"2")
    kv = client.get(prefix + "a")
    assert kv is not None and (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"2", r1, r3, 2)
    kvs, rev = client.get_prefix(prefix)
    assert [(k.key, k.value) for k in kvs] == [(prefix + "a", b"2"), (prefix + "b", b"\x00\xff binary")]
    assert rev >= r3
    assert client.delete(prefix + "a") == 1
    assert client.delete(prefix + "a") == 0
    client.put(prefix + "c", b"")
    assert client.delete(prefix, prefix=True) == 2
    assert client.get_prefix(prefix)[0] == []
    assert client.get(prefix[:-1] + "0") is not None


@pytest.mark.cluster
@pytest.mark.parametrize(
    "make_true, make_false",
    [
        (lambda k, kv: Compare.value_is(k, b"v"), lambda k, kv: Compare.value_is(k, b"w")),
        (lambda k, kv: Compare.created_at(k, kv.create_revision), lambda k, kv: Compare.created_at(k, 1)),
        (lambda k, kv: Compare.modified_at(k, kv.mod_revision), lambda k, kv: Compare(k, "mod_revision", "<", 1)),
        (lambda k, kv: Compare(k, "version", ">", 1), lambda k, kv: Compare(k, "version", "!=", 2)),
    ],
    ids=["value", "create_revision", "mod_revision", "version"],
)
def test_txn_branches_for_each_target(client, prefix, make_true, make_false):
    key = prefix + "k"
    client.put(key, b"first")
    client.put(key, b"v")  # version 2
    kv = client.get(key)
    assert kv is not None
    ok = client.txn([make_true(key, kv)], [Put(prefix + "s", b"yes"), Get(key)], [Put(prefix + "f", b"no")])
    assert ok.succeeded and ok.responses == [[], [kv]]
    assert client.get(prefix + "s") is not None and client.get(prefix + "f") is None
    bad = client.txn([make_true(key, kv), make_false(key, kv)], [Delete(key)], [Get(prefix, prefix=True)])
    assert not bad.succeeded and bad.revision == ok.revision  # nothing written
    assert [k.key for k in bad.responses[0]] == [prefix + "k", prefix + "s"]
    assert client.get(key) == kv


@pytest.mark.cluster
def test_absent_and_delete_prefix_in_a_txn(client, prefix):
    assert client.txn([Compare.absent(prefix + "x")], [Put(prefix + "x", b"1"), Put(prefix + "y", b"2")]).succeeded
    assert not client.txn([Compare.absent(prefix + "x")], [Put(prefix + "x", b"again")]).succeeded
    r = client.txn([], [Delete(prefix, prefix=True), Get(prefix, prefix=True)])
    assert r.succeeded and r.responses == [[], []]


def test_compare_type_is_checked():
    c = EtcdClient(["127.0.0.1:1"])
    with pytest.raises(ValueError):
        c.txn([Compare("k", "version", "==", b"1")], [])
    with pytest.raises(ValueError):
        c.txn([Compare("k", "value", "==", 1)], [])


# -- leases and fencing --------------------------------------------------------------------------


@pytest.mark.cluster
def test_two_controllers_race_exactly_one_wins_and_its_epoch_fences(etcd_cluster, prefix):
    key = prefix + "controller"
    a = EtcdClient(etcd_cluster.endpoints)
    b = EtcdClient(list(reversed(etcd_cluster.endpoints)))  # talk to another member first
    try:
        leases = {"a": a.lease_grant(5), "b": b.lease_grant(5)}
        results: dict[str, bool] = {}
        go = threading.Barrier(2)

        def campaign(name: str, c: EtcdClient) -> None:
            go.wait(5)
            r = c.txn([Compare.absent(key)], [Put(key, name.encode(), leases[name])], [Get(key)])
            results[name] = r.succeeded

        threads = [threading.Thread(daemon=True, target=campaign, args=item) for item in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert sorted(results.values()) == [False, True]
        winner = "a" if results["a"] else "b"
        loser = "b" if winner == "a" else "a"
        cw, cl = (a, b) if winner == "a" else (b, a)
        kv = cl.get(key)
        assert kv is not None and kv.value == winner.encode() and kv.lease == leases[winner]
        epoch = kv.create_revision
        assert cw.txn([Compare.created_at(key, epoch)], [Put(prefix + "map", b"by winner")]).succeeded
        # the winner's lease ends; the loser takes over with a new epoch; the old epoch is fenced
        cw.lease_revoke(leases[winner])
        assert cl.get(key) is None
        assert cl.txn([Compare.absent(key)], [Put(key, loser.encode(), leases[loser])]).succeeded
        new = cl.get(key)
        assert new is not None and new.create_revision > epoch
        stale = cw.txn([Compare.created_at(key, epoch)], [Put(prefix + "map", b"stale")])
        assert not stale.succeeded
        m = cl.get(prefix + "map")
        assert m is not None and m.value == b"by winner"
        cl.lease_revoke(leases[loser])
    finally:
        a.close()
        b.close()


@pytest.mark.cluster
def test_a_lapsed_lease_removes_its_keys(client, prefix):
    lease = client.lease_grant(1)  # etcd rounds tiny TTLs up to its minimum (1.5 x election timeout)
    client.put(prefix + "eph", b"x", lease)
    assert client.get(prefix + "eph") is not None
    assert wait_for(lambda: client.get(prefix + "eph") is None, 8.0)
    assert client.lease_keepalive(lease) == 0
    with pytest.raises(LeaseNotFound):
        client.put(prefix + "late", b"x", lease)
    with pytest.raises(LeaseNotFound):
        client.txn([], [Put(prefix + "late", b"x", lease)])


@pytest.mark.cluster
def test_keepalive_keeps_and_revoke_removes(client, prefix):
    lease = client.lease_grant(2)
    client.put(prefix + "kept", b"x", lease)
    deadline = time.monotonic() + 3.5  # well past the TTL
    while time.monotonic() < deadline:
        assert client.lease_keepalive(lease) >= 1
        time.sleep(0.5)
    assert client.get(prefix + "kept") is not None
    client.lease_revoke(lease)
    assert client.get(prefix + "kept") is None
    assert client.lease_keepalive(lease) == 0
    client.lease_revoke(lease)  # already gone: no error


# -- watches -------------------------------------------------------------------------------------


@pytest.mark.cluster
def test_watch_from_a_revision_sees_puts_and_deletes_in_order(client, prefix):
    start = client.put(prefix + "a", b"1")
    client.put(prefix + "b", b"2")
    client.put(prefix[:-1] + "~", b"outside")
    client.delete(prefix + "a")
    w = client.watch(prefix, start)
    try:
        client.put(prefix + "b", b"3")
        client.delete(prefix, prefix=True)
        got = drain(w, 5)
        assert [(e.type, e.kv.key, e.kv.value) for e in got] == [
            ("put", prefix + "a", b"1"),
            ("put", prefix + "b", b"2"),
            ("delete", prefix + "a", b""),
            ("put", prefix + "b", b"3"),
            ("delete", prefix + "b", b""),
        ]
        revs = [e.kv.mod_revision for e in got]
        assert revs == sorted(revs) and revs[0] == start
        assert w.poll(0.2) == []
    finally:
        w.cancel()
    with pytest.raises(MetaUnavailable):
        w.poll(0)


@pytest.mark.cluster
def test_watch_on_a_compacted_revision_raises(client, prefix):
    old = client.put(prefix + "a", b"1")
    latest = client.put(prefix + "a", b"2")
    client.compact(latest)
    w = client.watch(prefix, old)
    try:
        with pytest.raises(WatchCompacted):
            drain(w, 1)
    finally:
        w.cancel()
    w = client.watch(prefix, latest)  # from the compaction point on: fine
    try:
        assert [e.kv.value for e in drain(w, 1)] == [b"2"]
    finally:
        w.cancel()


# -- members failing -----------------------------------------------------------------------------


@pytest.mark.cluster
def test_kill9_one_member_client_rotates_and_the_member_rejoins(etcd_cluster, client, prefix):
    victim = etcd_cluster.members[0]  # the client's first (preferred) endpoint
    lone = EtcdClient([victim.endpoint], timeout_s=2.0)
    w = lone.watch(prefix, client.put(prefix + "before", b"0"))
    try:
        assert [e.kv.key for e in drain(w, 1)] == [prefix + "before"]
        victim.kill9()
        for i in range(20):
            deadline = time.monotonic() + 15
            while True:  # if the victim led, the others elect a leader first (~1 s; failing retriably meanwhile)
                try:
                    client.put(prefix + f"k{i}", str(i).encode())
                    break
                except MetaUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        assert len(client.get_prefix(prefix)[0]) == 21
        with pytest.raises(MetaUnavailable):
            drain(w, 1, seconds=3.0)  # its stream broke
        with pytest.raises(MetaUnavailable, match=re.escape(victim.endpoint)):
            lone.get(prefix + "k0")
        victim.start()  # same data dir: rejoins with initial-cluster-state existing
        assert victim.proc is not None and "existing" in victim.proc.args
        etcd_cluster.wait_healthy()
        kv = lone.get(prefix + "k19")  # a linearizable read through the rejoined member
        assert kv is not None and kv.value == b"19"
    finally:
        w.cancel()
        lone.close()
        etcd_cluster.heal()


@pytest.mark.cluster
def test_without_quorum_a_call_fails_within_the_timeout(etcd_cluster, prefix):
    c = EtcdClient(etcd_cluster.endpoints, timeout_s=1.0)
    try:
        c.put(prefix + "k", b"1")
        etcd_cluster.members[1].kill9()
        etcd_cluster.members[2].kill9()
        for call in (lambda: c.get(prefix + "k"), lambda: c.put(prefix + "k", b"2")):
            t0 = time.monotonic()
            with pytest.raises(MetaUnavailable) as err:
                call()
            assert time.monotonic() - t0 < 2.5
            for e in etcd_cluster.endpoints:
                assert e in str(err.value)
    finally:
        c.close()
        etcd_cluster.heal()


# -- fake members: what a member that hangs or drops the connection does to a call ---------------


class FakeMember:
    """A TCP listener on 127.0.0.1 that reads a request and then hangs (``mode="hang"``) or
    closes the connection (``mode="drop"``); counts the requests it took."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                if conn.recv(65536):
                    self.requests += 1
            except OSError:
                pass
            if self.mode == "drop":
                conn.close()
            else:
                self._conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self._conns:
            c.close()


@pytest.fixture
def fake() -> Iterator[Callable[[str], FakeMember]]:
    made: list[FakeMember] = []

    def make(mode: str) -> FakeMember:
        made.append(FakeMember(mode))
        return made[-1]

    yield make
    for m in made:
        m.close()


def test_every_member_down_names_them_all():
    ports = free_ports(2)
    c = EtcdClient([f"127.0.0.1:{p}" for p in ports], timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(MetaUnavailable) as err:
        c.get("k")
    assert time.monotonic() - t0 < 1.0
    assert all(f"http://127.0.0.1:{p}" in str(err.value) for p in ports)
    with pytest.raises(MetaUnavailable, match="watch"):
        c.watch("p/", 1)


def test_a_hanging_member_costs_one_attempt_then_the_next_is_asked(fake):
    hung, dropper = fake("hang"), fake("drop")
    c = EtcdClient([hung.endpoint, dropper.endpoint], timeout_s=0.5, attempt_timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(MetaUnavailable, match=r"no answer within 0\.3 s"):
        c.get("k")  # a read is safe to repeat: both members were asked
    assert 0.25 < time.monotonic() - t0 < 2.0
    assert (hung.requests, dropper.requests) == (1, 1)


def test_a_writing_txn_is_not_repeated_when_its_outcome_is_unknown(fake):
    dropper, other = fake("drop"), fake("drop")
    c = EtcdClient([dropper.endpoint, other.endpoint], timeout_s=1.0)
    with pytest.raises(MetaUnavailable, match="outcome unknown"):
        c.txn([Compare.absent("k")], [Put("k", b"v")])
    assert (dropper.requests, other.requests) == (1, 0)
    with pytest.raises(MetaUnavailable, match="no etcd member answered"):
        c.txn([], [Get("k")])  # read-only: tried on the next member first, then the other
    assert (dropper.requests, other.requests) == (2, 1)


# -- endpoints and member command lines ----------------------------------------------------------


def test_endpoints_and_prefix_ends():
    assert parse_endpoint("http://127.0.0.1:2379") == ("127.0.0.1", 2379)
    assert parse_endpoint("127.0.0.1:23790") == ("127.0.0.1", 23790)
    for bad in ("https://h:1", "h", "http://h:port", "http://h:1/x"):
        with pytest.raises(ConfigError, match="etcd endpoint"):
            parse_endpoint(bad)
    with pytest.raises(ConfigError):
        EtcdClient([])
    assert prefix_end("/a/") == b"/a0"
    assert prefix_end("a\U0010ffff") == b"a\xf4\x8f\xbf\xc0"
    assert prefix_end("") == b"\0"


def test_member_argv_and_missing_binary(monkeypatch, tmp_path):
    specs = [
        EtcdMemberSpec(f"m{i}", str(tmp_path / f"m{i}"), f"127.0.0.1:{20 + i}", f"http://127.0.0.1:{30 + i}")
        for i in range(3)
    ]
    fake_etcd = tmp_path / "bin" / "etcd"  # argv does not depend on an installed etcd
    fake_etcd.parent.mkdir()
    fake_etcd.write_text("#!/bin/sh\n")
    fake_etcd.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake_etcd.parent))
    args = etcd_members.argv(specs[1], specs, new=True)
    assert args[0] == str(fake_etcd)
    flags = dict(zip(args[1::2], args[2::2]))
    assert flags["--name"] == "m1" and flags["--initial-cluster-state"] == "new"
    assert flags["--listen-client-urls"] == flags["--advertise-client-urls"] == "http://127.0.0.1:21"
    assert flags["--initial-cluster"] == "m0=http://127.0.0.1:30,m1=http://127.0.0.1:31,m2=http://127.0.0.1:32"
    assert (flags["--heartbeat-interval"], flags["--election-timeout"]) == ("100", "1000")
    assert "existing" in etcd_members.argv(specs[0], specs, new=False)
    with pytest.raises(ConfigError, match="not in the cluster"):
        etcd_members.argv(EtcdMemberSpec("x", "d", "h:1", "h:2"), specs, new=True)
    fake_etcd.unlink()
    with pytest.raises(ConfigError, match="apt-get install etcd-server etcd-client"):
        etcd_members.start(specs[0], specs, tmp_path / "log")
    with pytest.raises(MetaUnavailable, match="not healthy"):
        etcd_members.wait_healthy([f"127.0.0.1:{free_ports(1)[0]}"], 0.3)


@pytest.mark.cluster
def test_one_client_shared_by_threads(client, prefix):
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(25):
                client.put(f"{prefix}{t}/{i}", b"x")
                assert client.get(f"{prefix}{t}/{i}") is not None
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(daemon=True, target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(client.get_prefix(prefix)[0]) == 100
