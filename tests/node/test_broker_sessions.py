"""Sessions on the broker driven in memory: a client silent past its session timeout loses its
subscriptions, and its leases and partitions go to the members that are still there; a heartbeat
keeps a session (over sockets: tests/integration/test_shared_recovery.py, test_groups.py)."""

from __future__ import annotations

from fabric.errors import BadParameter
from fabric.protocol.ops import Op
from tests.node.harness import ALICE, BOB, BrokerHarness, values

SESSION_MS = 1000


def subscribe(h: BrokerHarness, client: bytes, **params) -> int:
    reply = h.call(Op.SUBSCRIBE, {"queue": "q", "session_timeout_ms": SESSION_MS, **params}, client=client)
    return reply["subscription"]


def keep_alive(h: BrokerHarness, client: bytes, ms: int, every_ms: int = 200) -> None:
    """Move the clock ``ms`` on while ``client`` (only) sends a HEARTBEAT every ``every_ms``."""
    for _ in range(ms // every_ms):
        h.call(Op.HEARTBEAT, {}, client=client)
        h.advance(every_ms)


def test_heartbeats_keep_a_session_and_silence_ends_it(harness):
    h = harness
    h.create_queue("q")
    sub = subscribe(h, ALICE, start="latest")
    keep_alive(h, ALICE, 3 * SESSION_MS)
    assert h.call(Op.HEARTBEAT, {}) == {"subscriptions": [sub]}
    h.advance(SESSION_MS + 200)  # silent; sessions are looked at every 200 ms
    assert h.call(Op.HEARTBEAT, {}) == {"subscriptions": []}
    h.produce("q", b"x", client=BOB)
    assert h.pushes(ALICE) == []


def test_an_expired_queue_member_gives_its_leases_to_the_others(harness):
    h = harness
    h.create_queue("q", visibility_timeout_ms=60_000)
    h.produce("q", b"a", b"b")
    subscribe(h, ALICE, group="workers", kind="queue")
    assert h.pushed_values(ALICE) == [b"a", b"b"]
    subscribe(h, BOB, group="workers", kind="queue")
    keep_alive(h, BOB, SESSION_MS - 200)
    assert h.pushes(BOB) == []
    keep_alive(h, BOB, 600)  # long before the visibility timeout: the session ended
    [push] = h.pushes(BOB)
    assert values(push) == [b"a", b"b"] and push.params["leases"] == [[0, 2, 2]]


def test_an_expired_stream_group_member_hands_its_partitions_over(harness):
    h = harness
    h.create_queue("q", partitions=2)
    subscribe(h, ALICE, group="g")
    b = subscribe(h, BOB, group="g")
    [revoke] = h.pushes(ALICE)
    assert revoke.params["revoked"] == [1]  # ALICE never confirms: BOB waits for partition 1
    keep_alive(h, BOB, SESSION_MS)
    assert h.pushes(BOB) == []
    keep_alive(h, BOB, 200)  # ALICE's session is over: BOB takes both partitions
    [assign] = h.pushes(BOB)
    assert assign.params["assigned"] == {"0": 0, "1": 0}
    h.call(Op.COMMIT, {"queue": "q", "group": "g", "offsets": {"0": 0, "1": 0}, "subscription": b}, client=BOB)


def test_a_session_timeout_outside_the_node_bounds_is_refused(harness):
    h = harness
    h.create_queue("q")
    for timeout in (100, 400_000):
        m = h.request(Op.SUBSCRIBE, {"queue": "q", "session_timeout_ms": timeout})
        assert m.header.status == BadParameter.code and "min_session_timeout_ms" in m.params["message"]
