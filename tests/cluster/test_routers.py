"""The router tier on real processes: three `fabric node start` stores and two `fabric router
start` routers on 127.0.0.1 against the run's etcd. Clients are given only the routers."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import FabricError, UnknownQueue
from tests.cluster_procs import ClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def _create(c: ClusterProcs, queue: str, partitions: int, **settings: object) -> None:
    with Admin(c.all_routers, timeout_ms=10_000) as admin:
        reply = admin.create_queue(queue, partitions=partitions, **settings)
    assert len(reply["placement"]) == partitions
    # no wait for the nodes' watches: a node asks etcd about a queue it has not heard of yet


def test_produce_and_consume_through_the_routers_only(routed: ClusterProcs) -> None:
    status = routed.status()
    assert [(r["name"], r["live"]) for r in status["routers"]] == [("r1", True), ("r2", True)]
    _create(routed, "orders", 3)
    with Admin(routed.all_routers) as admin:
        deadline = time.monotonic() + 5  # each node learns the map from its etcd watch (~100 ms)
        while "orders" not in [q["name"] for q in admin.list_queues()]:
            assert time.monotonic() < deadline, admin.list_queues()
            time.sleep(0.05)
        assert [q["name"] for q in admin.iter_queues(page=1)] == [q["name"] for q in admin.list_queues()]
        with pytest.raises(UnknownQueue):
            admin.describe_queue("nope")
    with Producer(routed.all_routers, acks="all") as prod:
        futs = [prod.send("orders", b"m%d" % i, key=b"k%d" % (i % 13)) for i in range(3000)]
        prod.flush(30)
    metas = [f.result(10) for f in futs]
    assert {m.partition for m in metas} == {0, 1, 2}
    # a group through a router: the router sends SUBSCRIBE to the coordinator, CREDIT and
    # commits to the node that granted the subscription, HEARTBEATs to every node of the session
    got: list[bytes] = []
    with Consumer("orders", routed.all_routers, group="g", start="earliest", heartbeat_ms=300) as cons:
        deadline = time.monotonic() + 30
        while len(got) < 3000 and time.monotonic() < deadline:
            b = cons.poll_batch(1000)
            if b is not None:
                got.extend(b.values)
        cons.commit()
        time.sleep(1.0)  # heartbeats through the router: the subscription stays
        assert cons.poll_batch(200) is None
    assert sorted(got) == sorted(b"m%d" % i for i in range(3000))
    # each router's metrics: the requests it took, and which nodes it sent them to
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    totals = {}
    for r, url in routed.router_metrics.items():
        with urllib.request.urlopen(url, timeout=10) as resp:
            families = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
        assert {"fabric_router_requests", "fabric_router_forwarded", "fabric_router_clients"} <= set(families)
        totals[r] = sum(s.value for s in families["fabric_router_forwarded"].samples if s.name.endswith("_total"))
        assert families["fabric_router_nodes"].samples[0].value == 3
    assert sum(totals.values()) > 10  # the producer's and consumer's requests went through them
    with Admin(routed.all_routers) as admin:
        assert sum(admin.committed("orders", "g").values()) == 3000
    # a queue subscription (shared leases) through the router: acks go to the granting node
    with Producer(routed.all_routers, acks="all") as prod:
        for i in range(200):
            prod.send("orders", b"w%d" % i, partition=i % 3)
        prod.flush(30)
    done: set[bytes] = set()
    with Consumer("orders", routed.all_routers, group="workers", kind="queue", start="earliest") as worker:
        deadline = time.monotonic() + 30
        while len(done) < 3200 and time.monotonic() < deadline:
            for m in worker.poll(1.0):
                done.add(m.value)
                worker.ack(m)
        worker.flush_acks()
    assert len(done) == 3200
    # a direct (brokerless) queue in the cluster: consumers register with its coordinator through
    # the router, the producer finds them there and sends straight to them
    _create(routed, "ticks", 1, mode="direct")
    with Consumer("ticks", routed.all_routers, heartbeat_ms=500) as tick:
        deadline = time.monotonic() + 10
        with Admin(routed.all_routers) as admin:
            while not admin.describe_queue("ticks")["direct_consumers"]:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        with Producer(routed.all_routers, linger_ms=0) as prod:
            futs = [prod.send("ticks", b"t%d" % i) for i in range(100)]
            assert all(f.result().offset is None for f in futs)
        ticks: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(ticks) < 100 and time.monotonic() < deadline:
            b = tick.poll_batch(200)
            if b is not None:
                ticks.extend(b.values)
        assert sorted(ticks) == sorted(b"t%d" % i for i in range(100))
    # create, then use at once through another entry point: the node that gets the request may not
    # have the queue from its watch yet; it asks etcd and waits instead of answering UNKNOWN_QUEUE
    stores = list(routed.endpoints.values())
    admins = {name: Admin(endpoint) for name, endpoint in routed.endpoints.items()}
    for admin in admins.values():
        admin.ping()  # connected before the create, so the next request races the watch
    for i in range(3):
        queue = f"fresh{i}"
        placement = admins[f"n{i + 1}"].create_queue(queue, partitions=3)["placement"]
        for p, record in enumerate(placement):  # straight to each partition's leader
            assert admins[record["leader"]].list_offsets(queue, p)["offset"] == 0
        other = stores[(i + 1) % 3] if i < 2 else routed.all_routers
        with Producer(other, acks="all") as prod:
            futs = [prod.send(queue, b"f%d" % n, partition=n % 3) for n in range(30)]
            prod.flush(30)
        assert all(f.result(10).offset is not None for f in futs)
        with Consumer(queue, stores[(i + 2) % 3], group="now", start="earliest") as cons:
            fresh: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(fresh) < 30 and time.monotonic() < deadline:
                b = cons.poll_batch(100)
                if b is not None:
                    fresh.extend(b.values)
        assert sorted(fresh) == sorted(b"f%d" % n for n in range(30))
    # the same with a node that hears of the queue late: paused while it is created, then asked
    # at once (its watch brings the queue a moment after its loop takes the request)
    controller = routed.status()["controller"]["name"]
    late, via = [n for n in admins if n != controller][:2]
    routed.signal(late, signal.SIGSTOP)
    try:
        placement = admins[via].create_queue("late-news", partitions=3)["placement"]
    finally:
        routed.signal(late, signal.SIGCONT)
    for p, record in enumerate(placement):
        assert admins[record["leader"]].list_offsets("late-news", p)["offset"] == 0
    assert admins[late].describe_queue("late-news")["name"] == "late-news"
    # a name etcd does not hold is still refused at once (one etcd read, no wait)
    with Admin(stores[0]) as admin:
        started = time.monotonic()
        with pytest.raises(UnknownQueue):
            admin.describe_queue("never-made")
        with Producer(stores[1], acks="all", retries=0) as prod, pytest.raises(UnknownQueue):
            prod.send("never-made", b"x", partition=0).result(10)
        assert time.monotonic() - started < 1.5
    for admin in admins.values():
        admin.close()


def test_a_router_killed_under_load_loses_nothing(routed: ClusterProcs) -> None:
    """kill -9 the router a producer and a consumer use: both go on through the other router
    within a second, and every acknowledged message is stored once and delivered."""
    _create(routed, "events", 3)
    total = 10_000
    acked: list[float] = []
    errors: list[BaseException] = []
    # a group member on the same router: it must not wait out its old session (10 s) to go on
    cons = Consumer("events", routed.all_routers, group="g", start="earliest", heartbeat_ms=500)
    victim = cons.connected_to
    prod = Producer(routed.all_routers, acks="all", linger_ms=2, request_timeout_ms=3000, retries=50)
    while prod.connected_to != victim:  # clients pick a router at random: put both on the same one
        prod.close()
        prod = Producer(routed.all_routers, acks="all", linger_ms=2, request_timeout_ms=3000, retries=50)
    name = next(r for r, e in routed.router_endpoints.items() if e == victim)
    received: list[tuple[float, bytes]] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            b = cons.poll_batch(200)
            if b is not None:
                now = time.monotonic()
                received.extend((now, v) for v in b.values)

    reader = threading.Thread(daemon=True, target=consume)
    reader.start()

    def produce() -> None:
        try:
            deadline = time.monotonic() + 60
            for i in range(total):
                if time.monotonic() > deadline:
                    break
                prod.send(
                    "events",
                    b"e%d" % i,
                    key=b"k%d" % (i % 31),
                    callback=lambda md, exc: acked.append(time.monotonic()) if exc is None else errors.append(exc),
                )
                if i % 25 == 0:
                    time.sleep(0.01)  # ~2,500 msg/s for ~4 s: a steady load, not a burst
            prod.flush(60)
        except BaseException as exc:
            errors.append(exc)

    try:
        t = threading.Thread(daemon=True, target=produce)
        t.start()
        time.sleep(1.0)
        killed_at = time.monotonic()
        os.kill(routed.procs.pop(name).pid, signal.SIGKILL)
        t.join(90)
        if t.is_alive() or errors:
            print(_stalled(routed, prod))
        prod.close()
        assert not errors, errors[:3]
        assert len(acked) == total
        after = [a for a in acked if a > killed_at]
        assert after, "nothing was acknowledged after the kill"
        gaps = [b - a for a, b in itertools.pairwise(acked) if b > killed_at]
        print(f"longest pause in acks after the kill: {max(gaps):.3f} s")
        assert max(gaps) < 1.0, f"the producer stalled {max(gaps):.2f} s after the router died"
        assert prod.connected_to != victim
        deadline = time.monotonic() + 30
        while len({v for _, v in received}) < total and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        reader.join(10)
        cons.close()
    assert len({v for _, v in received}) == total  # at least once through the failover
    stamps = [t for t, _ in received]
    pause = max((b - a for a, b in itertools.pairwise(stamps) if b > killed_at), default=0.0)
    print(f"longest pause in deliveries to the group member after the kill: {pause:.3f} s")
    assert pause < 1.0, f"the group member stalled {pause:.2f} s (its old subscription was not replaced)"
    # exactly once in the log: idempotent retries through the other router stored no duplicate
    seen: list[bytes] = []
    with Consumer("events", routed.all_routers, start="earliest") as cons:
        deadline = time.monotonic() + 30
        while len(seen) < total and time.monotonic() < deadline:
            b = cons.poll_batch(1000)
            if b is not None:
                seen.extend(b.values)
        assert cons.poll_batch(500) is None
    assert len(seen) == total and len(set(seen)) == total


def _stalled(c: ClusterProcs, prod: Producer) -> str:
    """What a producer that stopped getting acknowledgements was waiting for, and what the
    processes logged: enough to tell a client's stuck state from a router's or a node's."""
    sender, seq, recovery = prod._sender, prod._seq, prod._recovery
    conn = sender.conn
    ready = list(seq.ready)
    lines = [
        f"producer on {conn.current_endpoint()} (generation {conn.generation()}, seen {sender.gen}, "
        f"up {getattr(conn, '_up', '?')}): {len(ready)} ready, {len(sender.inflight)} in flight, "
        f"{prod._outcomes.unfinished} unfinished, retried {prod.retried}, losses {prod.connection_losses}, "
        f"resets {prod.identity_resets}, resetting {recovery.resetting}, ident request {recovery.ident_rid}",
        f"lanes: {seq.lanes}",
        "oldest ready: "
        + ", ".join(
            f"{b.queue}/{b.partition} seq {b.sequence} ident {b.ident} tries {b.tries} unknown {b.unknown} "
            f"retry_at {b.retry_at:.1f}"
            for b in ready[:6]
        ),
    ]
    for log in sorted(c.root.glob("*.log")):
        lines.append(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}")
    return "\n".join(lines)


def test_a_router_refuses_what_a_client_may_not_send(routed: ClusterProcs) -> None:
    import zmq

    from fabric.protocol import frames as fr
    from fabric.protocol.ops import Op

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(routed.router_endpoints["r1"])
    try:
        cases = [
            [b"garbage"],
            [fr.Header(Op.PING, 7, fr.FLAG_FORWARDED).encode(), b""],
            [fr.Header(Op.REPLICA_FETCH, 8).encode(), b"{}"],
            [fr.Header(Op.PRODUCE, 9).encode(), b"{not json"],
            [fr.Header(Op.PRODUCE, 10).encode(), fr.encode_params({"queue": "events"})],
        ]
        for frames in cases:
            s.send_multipart(frames)
            assert s.poll(5000), f"no answer to {frames!r}"
            reply = fr.decode(s.recv_multipart())
            assert reply.header.status != 0 and reply.params["error"]
        # random and mutated frames (the fuzz test's generator): no crash, the router serves on
        import random

        from tests.integration.test_fuzz_ports import _random_frames, _valid_requests

        rng = random.Random(20261125)
        valid = _valid_requests(rng)
        deadline = time.monotonic() + 20
        for _ in range(400):
            if time.monotonic() > deadline:
                break
            s.send_multipart(_random_frames(rng, valid))
            while s.poll(5):
                s.recv_multipart()
        assert all(p.poll() is None for p in routed.procs.values()), "a process died"
        while s.poll(300):
            s.recv_multipart()
        s.send_multipart([fr.Header(Op.PING, 11).encode(), b""])
        assert s.poll(5000)
        assert fr.decode(s.recv_multipart()).header.status == 0  # the router serves on
    finally:
        s.close()
    with pytest.raises(FabricError), Producer(routed.all_routers, request_timeout_ms=3000) as prod:
        prod.send("no-such-queue", b"x").result(10)


def _fabric(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_adding_a_fourth_store_under_load_then_draining_it_loses_nothing(etcd_cluster, tmp_path) -> None:
    """cluster-3 behind a router, a producer at work: start a 4th store, `fabric cluster add-node`
    moves at most 30% of the replicas onto it; `drain` moves them all off again; every message
    acknowledged with acks=all is there once, and the drained store holds nothing."""
    c = ClusterProcs(tmp_path, list(etcd_cluster.endpoints), size=4, routers=1)
    try:
        for n in ("n1", "n2", "n3"):
            c.start(n)
        c.start_router("r1")
        c.wait(lambda s: sum(x["live"] for x in s["nodes"]) == 3 and s["controller"] and s["routers"][0]["live"], 30)
        _create(c, "grow", 8)
        total = 8000
        acked: list[int] = []
        errors: list[BaseException] = []
        prod = Producer(c.all_routers, acks="all", linger_ms=2, request_timeout_ms=5000, retries=100)

        def produce() -> None:
            try:
                for i in range(total):
                    prod.send(
                        "grow",
                        b"g%d" % i,
                        key=b"k%d" % (i % 64),
                        callback=lambda md, exc, i=i: acked.append(i) if exc is None else errors.append(exc),
                    )
                    if i % 40 == 0:
                        time.sleep(0.01)  # ~2,000 msg/s for ~4 s
                prod.flush(90)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(daemon=True, target=produce)
        t.start()
        c.start("n4")
        r = _fabric("cluster", "add-node", "n4", "--config", str(c.config), "--wait", "--timeout", "90", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        added = json.loads(r.stdout.strip().splitlines()[-1])
        print("add-node:", {k: v for k, v in added.items() if k != "moves"})
        assert 0 < added["replicas_moved"] <= 0.30 * added["replicas"], added
        t.join(120)
        prod.close()
        assert not errors, errors[:3]
        assert len(acked) == total
        status = c.status()
        assert not status["moves"]
        on_n4 = [p for p in status["partitions"] if p["queue"] == "grow" and "n4" in p["replicas"]]
        assert len(on_n4) == added["replicas_moved"] and all("n4" in p["isr"] for p in on_n4)

        def read_all() -> list[bytes]:
            seen: list[bytes] = []
            with Consumer("grow", c.all_routers, start="earliest") as cons:
                deadline = time.monotonic() + 30
                while len(seen) < total and time.monotonic() < deadline:
                    b = cons.poll_batch(1000)
                    if b is not None:
                        seen.extend(b.values)
            return seen

        seen = read_all()
        assert len(seen) == total and len(set(seen)) == total
        # drain n4: everything moves off it again, and it drops the queue's files
        r = _fabric("cluster", "drain", "n4", "--config", str(c.config), "--wait", "--timeout", "90", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        status = c.status()
        assert not any("n4" in p["replicas"] for p in status["partitions"])
        # a dropped replica's directory is renamed aside, then removed: wait for the removal too
        deadline = time.monotonic() + 10
        while any((tmp_path / "n4").rglob("*.log")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any((tmp_path / "n4").rglob("*.log")), list((tmp_path / "n4").rglob("*.log"))[:10]
        seen = read_all()
        assert len(seen) == total and len(set(seen)) == total
    finally:
        c.stop_all()


def test_a_delayed_message_survives_its_partition_moving_off_the_node_that_took_it(etcd_cluster, tmp_path) -> None:
    """A delayed batch is in every replica's delay store: after its partition moved away (drain)
    the new replica got it with its catch-up and the new leader delivers it once when due."""
    c = ClusterProcs(tmp_path, list(etcd_cluster.endpoints), size=3, rf=2, min_insync=1)
    try:
        c.start_all()
        with Admin(c.endpoints["n1"], timeout_ms=10_000) as admin:
            admin.create_queue("later", partitions=1)
        c.wait(lambda s: any(p["queue"] == "later" and p["leader"] for p in s["partitions"]))
        leader = c.leader("later", 0)
        assert leader is not None
        with Producer(c.endpoints[leader], acks="leader", idempotent=False) as prod:
            prod.send("later", b"due-later", delay_ms=4000).result(10)
            prod.send("later", b"now").result(10)
        r = _fabric("cluster", "drain", leader, "--config", str(c.config), "--wait", "--timeout", "60", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert leader not in next(p for p in c.status()["partitions"] if p["queue"] == "later")["replicas"]
        others = ",".join(e for n, e in c.endpoints.items() if n != leader)
        seen: list[bytes] = []
        with Consumer("later", others, start="earliest") as cons:
            deadline = time.monotonic() + 20
            while b"due-later" not in seen and time.monotonic() < deadline:
                b = cons.poll_batch(500)
                if b is not None:
                    seen.extend(b.values)
        assert seen.count(b"due-later") == 1 and seen.count(b"now") == 1, seen
    finally:
        c.stop_all()


def test_a_leader_aware_producer_sends_to_each_leader_and_follows_a_failover(routed: ClusterProcs) -> None:
    """LeaderProducer, given only the routers: it reads the map through them, sends each
    partition's batches straight to its leader, and after a kill -9 of a leader goes on (through
    a live node, then the new leader) with every acknowledged message stored once, in key order."""
    from fabric.client import LeaderProducer

    _create(routed, "direct-to-leaders", 3)
    keys = [b"k%d" % i for i in range(30)]
    acked: dict[bytes, list[int]] = {k: [] for k in keys}
    with LeaderProducer(routed.all_routers, acks="all", refresh_ms=300) as prod:
        futs = [(k, n, prod.send("direct-to-leaders", b"%s:%d" % (k, n), key=k)) for n in range(20) for k in keys]
        prod.flush(30)
        for k, n, f in futs:
            f.result(10)
            acked[k].append(n)
        # a partition whose leader was not elected yet when the producer first looked (the queue
        # is a moment old) went through the routers; its leader comes with the next refresh of
        # the map (refresh_ms 300), which a fast run can finish sending before
        deadline = time.monotonic() + 5
        while sum(q == "direct-to-leaders" for q, _ in prod.leaders()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        leaders = prod.leaders()
        status = routed.status()
        for p in range(3):  # each partition's inner producer talks to its leader
            name = next(
                x["leader"] for x in status["partitions"] if x["queue"] == "direct-to-leaders" and x["partition"] == p
            )
            assert leaders[("direct-to-leaders", p)] == routed.endpoints[name]
        victim = routed.leader("direct-to-leaders", 0)
        assert victim is not None
        routed.kill9(victim)
        deadline = time.monotonic() + 30
        n = 20
        while time.monotonic() < deadline and prod.leader_moves == 0:
            futs = [(k, n, prod.send("direct-to-leaders", b"%s:%d" % (k, n), key=k)) for k in keys]
            prod.flush(30)
            for k, m, f in futs:
                f.result(30)
                acked[k].append(m)
            n += 1
            time.sleep(0.1)
        assert prod.leader_moves > 0  # the map moved and the sends followed it
    live = ",".join(e for name, e in routed.endpoints.items() if name != victim)
    got: dict[bytes, list[int]] = {k: [] for k in keys}
    with Consumer("direct-to-leaders", live, group="check", start="earliest") as cons:
        want = sum(map(len, acked.values()))
        seen = 0
        deadline = time.monotonic() + 30
        while seen < want and time.monotonic() < deadline:
            b = cons.poll_batch(1000)
            if b is not None:
                for v in b.values:
                    k, m = v.split(b":")
                    got[k].append(int(m))
                    seen += 1
    for k in keys:  # every acknowledged message once, in order per key
        assert got[k] == acked[k], (k, victim, f"acked {acked[k]}", f"read {got[k]}")
