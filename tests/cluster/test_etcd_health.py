"""Which etcd member a call asks, and how long one silent member may cost it: ``MemberHealth``
alone (pure), ``EtcdClient`` against tiny in-process fake members on 127.0.0.1 (one answers, one
hangs like a member cut off silently, one refuses with "no leader"), and ``NodeAgent``'s own
fencing when etcd stays out of reach (on the in-memory etcd)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fabric.cluster.agent import NodeAgent
from fabric.cluster.etcd import EtcdClient
from fabric.cluster.etcd_health import MemberHealth
from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.meta import Compare, MetaUnavailable, Put

# -- MemberHealth (pure) ---------------------------------------------------------------------------


def test_the_preferred_member_first_then_the_others_in_turn() -> None:
    h = MemberHealth(3)
    assert h.order(0.0) == [0, 1, 2]
    h.answered(2)
    assert h.order(0.0) == [2, 0, 1]


def test_a_failed_member_is_asked_last_until_it_answers() -> None:
    h = MemberHealth(3, backoff_s=0.5, backoff_max_s=2.0)
    h.failed(0, now=10.0)
    assert h.preferred == 1 and h.suspect(0, 10.0)
    assert h.order(10.1) == [1, 2, 0]
    assert h.order(11.0) == [1, 2, 0]  # back-off over: still behind every healthy member
    assert not h.suspect(0, 11.0)
    h.answered(0)
    assert h.order(11.0) == [0, 1, 2] and h.failures(0) == 0


def test_back_off_doubles_up_to_its_cap_and_suspects_are_ordered_by_it() -> None:
    h = MemberHealth(3, backoff_s=0.5, backoff_max_s=2.0)
    for now in (0.0, 0.0, 0.0, 0.0):
        h.failed(1, now)
    assert h.failures(1) == 4 and h.suspect(1, 1.9) and not h.suspect(1, 2.0)  # 0.5, 1, 2, 2 (capped)
    h.failed(2, 0.0)  # suspect until 0.5
    assert h.order(0.1) == [0, 2, 1]  # the sooner back to health first
    assert h.order(0.6) == [0, 2, 1]  # 2's back-off is over: before the one still waiting
    h.failed(0, 0.6)
    assert h.order(0.7) == [2, 0, 1]  # every member suspect: all are still asked


def test_the_preferred_member_moves_only_to_a_healthy_one() -> None:
    h = MemberHealth(2)
    h.failed(0, 0.0)
    assert h.preferred == 1
    h.failed(1, 0.0)
    assert h.preferred == 1  # nobody healthy: stays
    with pytest.raises(ValueError):
        MemberHealth(0)


# -- EtcdClient against fake members ---------------------------------------------------------------


class FakeGateway:
    """An HTTP server on 127.0.0.1 that plays one etcd member: ``ok`` answers every call,
    ``hang`` takes it and never answers (a member cut off silently), ``noleader`` refuses like
    a member cut off from the quorum. ``calls`` counts the requests it took, by path."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls: dict[str, int] = {}
        self._release = threading.Event()
        gw = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                gw.calls[self.path] = gw.calls.get(self.path, 0) + 1
                if gw.mode == "hang":
                    gw._release.wait(10)
                    return
                if gw.mode == "noleader":
                    self._send(503, {"error": "etcdserver: no leader", "code": 14, "message": "etcdserver: no leader"})
                elif self.path == "/v3/lease/keepalive":
                    self._send(200, {"result": {"ID": "7", "TTL": "2"}})
                else:
                    self._send(200, {"header": {"revision": "9"}, "succeeded": True})

            def _send(self, status: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def n(self, path: str) -> int:
        return self.calls.get(path, 0)

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway() -> Iterator[Callable[[str], FakeGateway]]:
    made: list[FakeGateway] = []

    def make(mode: str) -> FakeGateway:
        made.append(FakeGateway(mode))
        return made[-1]

    yield make
    for g in made:
        g.close()


KEEPALIVE = "/v3/lease/keepalive"


def test_a_silent_member_costs_one_short_attempt_then_is_asked_last(gateway) -> None:
    silent, healthy = gateway("hang"), gateway("ok")
    c = EtcdClient([silent.endpoint, healthy.endpoint], timeout_s=2.0, attempt_timeout_s=0.2)
    try:
        t0 = time.monotonic()
        assert c.lease_keepalive(7) == 2
        assert time.monotonic() - t0 < 0.6  # one attempt (0.2 s), not the whole 2 s timeout
        assert (silent.n(KEEPALIVE), healthy.n(KEEPALIVE)) == (1, 1)
        for _ in range(10):  # from now on the healthy one first: no wait at all
            t0 = time.monotonic()
            assert c.lease_keepalive(7) == 2
            assert time.monotonic() - t0 < 0.15
        assert silent.n(KEEPALIVE) == 1 and c.health.preferred == 1
    finally:
        c.close()


def test_when_every_member_is_slow_one_gets_the_rest_of_the_timeout(gateway) -> None:
    a, b = gateway("hang"), gateway("hang")
    c = EtcdClient([a.endpoint, b.endpoint], timeout_s=1.0, attempt_timeout_s=0.2)
    try:
        t0 = time.monotonic()
        with pytest.raises(MetaUnavailable, match="again"):
            c.get("k")
        assert 0.9 < time.monotonic() - t0 < 1.5  # bounded by timeout_s, not 3 attempts of it
        assert a.n("/v3/kv/range") == 2 and b.n("/v3/kv/range") == 1
    finally:
        c.close()


def test_no_leader_moves_on_even_for_a_write(gateway) -> None:
    cut, healthy = gateway("noleader"), gateway("ok")
    c = EtcdClient([cut.endpoint, healthy.endpoint])
    try:
        assert c.txn([Compare.absent("k")], [Put("k", b"v")]).succeeded  # refused before proposing: safe
        assert (cut.n("/v3/kv/txn"), healthy.n("/v3/kv/txn")) == (1, 1)
        assert c.health.preferred == 1
    finally:
        c.close()


def test_a_write_that_went_unanswered_is_not_repeated_but_fails_in_time(gateway) -> None:
    silent, healthy = gateway("hang"), gateway("ok")
    c = EtcdClient([silent.endpoint, healthy.endpoint], timeout_s=0.5, attempt_timeout_s=0.1)
    try:
        t0 = time.monotonic()
        with pytest.raises(MetaUnavailable, match="outcome unknown"):
            c.txn([Compare.absent("k")], [Put("k", b"v")])
        assert time.monotonic() - t0 < 1.0
        assert (silent.n("/v3/kv/txn"), healthy.n("/v3/kv/txn")) == (1, 0)
        assert c.txn([Compare.absent("k")], [Put("k", b"v")]).succeeded  # the next one goes elsewhere
        assert healthy.n("/v3/kv/txn") == 1
    finally:
        c.close()


def test_a_busy_connection_is_not_waited_for(gateway) -> None:
    slow, healthy = gateway("hang"), gateway("ok")
    c = EtcdClient([slow.endpoint, healthy.endpoint], timeout_s=1.0, attempt_timeout_s=0.8)
    try:
        t = threading.Thread(target=c.get, args=("k",), daemon=True)
        t.start()  # holds the slow member's connection for 0.8 s, then asks the other
        time.sleep(0.1)
        t0 = time.monotonic()
        c.health.answered(0)  # still preferred: the other thread has not failed it yet
        c.lease_keepalive(7)
        assert time.monotonic() - t0 < 0.5
        t.join(3)
    finally:
        c.close()


# -- NodeAgent: fencing itself when etcd stays out of reach ---------------------------------------


def test_agent_fences_itself_only_after_ttl_plus_grace_without_etcd() -> None:
    m = MemoryEtcd()
    a = NodeAgent(m, "a", "tcp://a", lease_ttl_s=2, fence_grace_ms=2000)
    a.step(0)
    assert a.registered
    m.set_available(False)  # cut off from the etcd majority
    for now in range(100, 4000, 100):
        a.step(now)
        assert a.registered and not a.fenced, now  # an etcd election lasts up to ~2 s: no fencing
    a.step(4100)
    assert a.fenced and not a.registered
    m.set_available(True)  # heal: registers again, with a new epoch
    m.advance(4200)
    a.step(4200 + 1000)
    assert a.registered and not a.fenced
