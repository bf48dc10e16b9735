"""The router's routing decisions (fabric/router/routing.py, pure) and the routed envelope the
storage node unwraps (fabric/node/server.py), in memory."""

from __future__ import annotations

import collections

from fabric.node.server import unwrap_routed
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from fabric.router.routing import FANOUT, ClientState, RouteMap, home, merge_heartbeats, subscribe_target, target

NODES = {"a": "tcp://127.0.0.1:1", "b": "tcp://127.0.0.1:2", "c": "tcp://127.0.0.1:3"}


def _map(rf: int = 3, dead: str | None = None) -> RouteMap:
    names = sorted(NODES)
    rows = []
    for q, n in (("orders", 3), ("solo", 1)):
        for p in range(n):
            replicas = [names[(p + i) % 3] for i in range(rf)]
            rows.append((q, p, replicas[0], replicas))
    live = {k: v for k, v in NODES.items() if k != dead}
    return RouteMap.build(live, rows)


def test_partition_requests_go_to_the_leader() -> None:
    m = _map()
    st = ClientState()
    for p, leader in enumerate("abc"):
        assert target(Op.PRODUCE, {"queue": "orders", "partition": p}, b"c1", st, m) == leader
        assert target(Op.FETCH, {"queue": "orders", "partition": p, "offset": 0}, b"c1", st, m) == leader


def test_a_dead_leader_or_an_unknown_queue_goes_to_the_home_node() -> None:
    m = _map(dead="b")
    st = ClientState()
    got = target(Op.PRODUCE, {"queue": "orders", "partition": 1}, b"c1", st, m)
    assert got == home(b"c1", m.nodes) and got in ("a", "c")
    assert target(Op.PRODUCE, {"queue": "new", "partition": 0}, b"c1", st, m) == home(b"c1", m.nodes)
    assert target(Op.PING, {}, b"c1", st, RouteMap()) is None  # no node lives: the router refuses


def test_home_spreads_clients_and_moves_only_the_clients_of_a_dead_node() -> None:
    clients = [b"client-%d" % i for i in range(3000)]
    before = {c: home(c, NODES) for c in clients}
    counts = collections.Counter(before.values())
    assert all(800 < n < 1200 for n in counts.values()), counts
    after = {c: home(c, [n for n in NODES if n != "b"]) for c in clients}
    moved = [c for c in clients if before[c] != after[c]]
    assert all(before[c] == "b" for c in moved) and len(moved) == counts["b"]


def test_subscriptions_go_to_the_coordinator_and_their_requests_follow_them() -> None:
    m = _map()
    st = ClientState()
    sub = {"queue": "orders", "group": "g", "kind": "stream", "partitions": None}
    assert target(Op.SUBSCRIBE, sub, b"c1", st, m) == "a"  # leader of partition 0
    assert target(Op.COMMITTED, {"queue": "orders", "group": "g"}, b"c1", st, m) == "a"
    st.subscriptions[7] = "b"
    st.queue_nodes["orders"] = "b"
    for op in (Op.CREDIT, Op.ACK, Op.NACK, Op.UNSUBSCRIBE, Op.CHANGE_VISIBILITY, Op.REVOKED):
        assert target(op, {"subscription": 7}, b"c1", st, m) == "b"
    assert target(Op.COMMIT, {"queue": "orders", "group": "g", "subscription": 7}, b"c1", st, m) == "b"
    assert target(Op.COMMIT, {"queue": "orders", "group": "g", "subscription": None}, b"c1", st, m) == "a"
    assert target(Op.HEARTBEAT, {}, b"c1", st, m) == FANOUT


def test_a_plain_stream_subscription_goes_to_a_node_holding_every_partition_it_names() -> None:
    m = _map(rf=1)  # orders/0 on a, /1 on b, /2 on c
    assert subscribe_target({"queue": "orders", "partitions": [1]}, m) == "b"
    assert subscribe_target({"queue": "orders", "partitions": [0]}, m) == "a"
    # nobody holds all three: the coordinator, which answers where they are
    assert subscribe_target({"queue": "orders", "partitions": None}, m) == "a"


def test_heartbeat_replies_merge() -> None:
    assert merge_heartbeats([{"subscriptions": [3, 1]}, {"subscriptions": [2]}, {}]) == {"subscriptions": [1, 2, 3]}


def test_the_node_unwraps_a_routed_envelope_and_refuses_a_broken_one() -> None:
    header = fr.Header(Op.PRODUCE, 42).encode()
    sent = fr.routed(header, b"\x00\x01\x02\x03\x04", "alice", [b"{}", b"batch"])
    assert sent[0][4] & fr.FLAG_ROUTED and sent[2] == b"alice"
    got = unwrap_routed([b"ROUTER1", *sent])
    assert got is not None
    (identity, h, params, data), principal = got
    assert principal == "alice"
    assert fr.split_routed(identity) == (b"ROUTER1", b"\x00\x01\x02\x03\x04")
    assert fr.decode_header(h) == fr.Header(Op.PRODUCE, 42)  # the flag is gone: the broker sees a request
    assert (params, data) == (b"{}", b"batch")
    assert unwrap_routed([b"R", *fr.routed(header, b"c", "", [b""])])[1] == ""  # a router without authentication
    routed = sent[0]
    assert unwrap_routed([b"ROUTER1", routed, b"", b"alice", b"{}"]) is None  # no client id
    assert unwrap_routed([b"ROUTER1", routed, b"c", b"{}"]) is None  # no principal frame
    assert unwrap_routed([b"ROUTER1", routed]) is None
    assert unwrap_routed([b"x" * 300, routed, b"c", b"", b"{}"]) is None  # no router id that long
    assert unwrap_routed([b"R", routed, b"c", b"\xff\xfe", b"{}"]) is None  # a principal is UTF-8
    assert unwrap_routed([b"R", routed, b"c", b"p" * 256, b"{}"]) is None  # of at most 255 bytes
    assert fr.unrouted(sent) == (header, b"\x00\x01\x02\x03\x04", "alice", [b"{}", b"batch"])
    assert fr.split_routed(b"\x00S\x00\x00\x00\x01") is None  # a stream client is not routed
    assert fr.split_routed(b"\x00R\x05abc") is None  # too short for its length byte


def test_a_route_map_changed_in_place_equals_one_built_whole() -> None:
    import random

    rng = random.Random(7)
    nodes = {"n1": "e1", "n2": "e2", "n3": "e3"}  # n4 is named by records but not live
    rows: dict[tuple[str, int], tuple[str | None, tuple[str, ...]]] = {}
    rmap = RouteMap.build(nodes, [])
    for _ in range(300):
        changes: dict[tuple[str, int], tuple[str | None, tuple[str, ...]] | None] = {}
        for _ in range(rng.randint(1, 6)):
            key = (f"q{rng.randrange(8)}", rng.randrange(4))
            if key in rows and rng.random() < 0.3:
                del rows[key]
                changes[key] = None
            else:
                replicas = tuple(rng.sample(["n1", "n2", "n3", "n4"], 3))
                rows[key] = changes[key] = (rng.choice([*replicas, None]), replicas)
        rmap = rmap.with_changes(changes)
        whole = RouteMap.build(nodes, [(q, p, leader, reps) for (q, p), (leader, reps) in rows.items()])
        assert rmap == whole


def test_a_ping_naming_a_store_goes_to_that_store_when_the_map_has_it() -> None:
    m = _map(dead="b")
    st = ClientState()
    for n in ("a", "c"):
        assert target(Op.PING, {"node": n}, b"c1", st, m) == n
    # a store the map does not name (dead, unknown): the home node answers, and its reply names it
    assert target(Op.PING, {"node": "b"}, b"c1", st, m) == home(b"c1", m.nodes)
    assert target(Op.PING, {"node": None}, b"c1", st, m) == home(b"c1", m.nodes)
    assert target(Op.CLUSTER_STATUS, {}, b"c1", st, m) == home(b"c1", m.nodes)
