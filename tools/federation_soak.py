"""Federation soak: issue 34's bars on real processes, one line per bar with its figure and PASS/FAIL.

Runs ``fabric up --config CONFIG`` (default configs/federation-2x3.toml: clusters "east" and
"west", 3 stores each with RF 3, a router each, one etcd member; ``--stores 1`` writes a variant
with one store per cluster and RF 1 to the scratch directory instead) in a scratch directory, all
on 127.0.0.1, and checks, in this order:

1. ``placement``: the first cluster is loaded beforehand (a queue of ``--preload`` partitions made
   on it directly), then ``--queues`` queues of one partition are made through the manager
   (``fabric queue create Q --clusters 1 --etcd``): both clusters get some, the loaded one fewer.
2. ``front door``: a queue split over both clusters (4 partitions) takes acks=all writes on every
   partition through one cluster's router, and one group reads them all through the other's; then
   the other way round.
4. ``move``: ``fabric queue move`` of a 3-partition queue under continuous acks=all load (one
   producer given the source cluster's router, re-sending what the sealed source refuses) with a
   group's committed offsets: lost, duplicates, per-partition order, the group's offsets on the
   destination, the longest pause between acknowledgements (bar: < 2 s; the pause is about two
   controller periods, so it follows ``federation_report_ms``: ``--report-ms`` sets it).
3. ``cluster lost``: the first cluster's supervisor is stopped (SIGSTOP, so it does not restart
   its stores at once) and its stores killed (kill -9, PIDs from its ``pids/`` files): p99 of
   acks=all single sends to a queue on the other cluster before and during (bar: within 1.5x);
   a send to a lost cluster's queue fails with CLUSTER_UNAVAILABLE naming the cluster (timed;
   bar: < 8 s); a new queue goes to the living cluster (once the planner drops the lost one,
   timed); the supervisor is continued (SIGCONT: it restarts the stores), and the lost cluster's
   queue is read back whole (bar: 0 acknowledged messages lost).
5. ``throughput`` (``--bench``, after the federation is stopped): ``fabric bench-cluster
   --federation`` (its own clusters): one queue through a second cluster's router vs its own.

Bounded: every wait has a deadline, every load loop a count and a deadline, and the federation
is stopped (SIGTERM to the supervisor this started, by PID) on every exit.

    python -m tools.federation_soak --seed 7
    python -m tools.federation_soak --seed 7 --report-ms 300 --bench
    python -m tools.federation_soak --stores 1
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabric.client import Admin, Consumer, Producer
from fabric.cluster.etcd import EtcdClient
from fabric.cluster.status import read_status
from fabric.errors import FabricError, QueueElsewhere, QueueMoved

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def _fabric(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric.cli", *args], capture_output=True, text=True, timeout=timeout, env=os.environ
    )


def _wait(what: str, ok: Callable[[], bool], timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if ok():
                return time.monotonic() - start
        except Exception:  # etcd or a node busy: look again
            pass
        time.sleep(0.2)
    raise SystemExit(f"federation soak: {what} did not happen within {timeout_s} s")


def _variant(root: Path, config: Path, stores: int, report_ms: int | None) -> Path:
    """CONFIG's clusters written under ``root``: with ``stores`` 1, one store each and RF 1; with
    ``report_ms``, that ``federation_report_ms``; the new federation config."""
    fed = tomllib.loads(config.read_text())
    names = []
    for rel in fed["federation"]["clusters"]:
        text = (config.parent / rel).read_text()
        out, skip = [], 0
        seen_node = False
        for line in text.splitlines():
            if stores == 1 and line.startswith("[[cluster.nodes]]"):
                if seen_node:
                    skip = 4  # the header and its three lines (id, listen, data_dir)
                seen_node = True
            if skip:
                skip -= 1
                continue
            if stores == 1 and line.startswith("replication_factor"):
                line = "replication_factor = 1"
            if stores == 1 and line.startswith("min_insync_replicas"):
                line = "min_insync_replicas = 1"
            if report_ms is not None and line.startswith("federation_report_ms"):
                line = f"federation_report_ms = {report_ms}"
            out.append(line)
        name = Path(rel).name
        (root / name).write_text("\n".join(out) + "\n")
        names.append(name)
    path = root / f"federation-2x{stores}.toml"
    path.write_text(f"[federation]\nclusters = {json.dumps(names)}\n")
    return path


class Fed:
    """The running federation: its clusters' names, routers, stores and supervisors, from the ready line."""

    def __init__(self, info: dict[str, Any], cluster_cfgs: dict[str, dict[str, Any]]) -> None:
        self.clusters = [c["name"] for c in info["clusters"]]
        self.router = {c["name"]: c["routers"][0]["endpoint"] for c in info["clusters"]}
        self.nodes = {c["name"]: [n["node"] for n in c["nodes"]] for c in info["clusters"]}
        self.supervisor = {c["name"]: int(c["pid"]) for c in info["clusters"]}
        self.data_dir = {c["name"]: Path(c["data_dir"]) for c in info["clusters"]}
        self.etcd = list(info["clusters"][0]["etcd"])
        self.urls = ",".join(self.etcd)
        self.cfgs = cluster_cfgs

    def status(self, cluster: str) -> dict[str, Any]:
        return read_status(self.etcd, cluster, self.nodes[cluster], [r["id"] for r in self.cfgs[cluster]["routers"]])

    def partitions(self, cluster: str, queue: str) -> int:
        return sum(1 for p in self.status(cluster)["partitions"] if p["queue"] == queue)

    def led(self, cluster: str, queue: str, n: int) -> bool:
        return sum(1 for p in self.status(cluster)["partitions"] if p["queue"] == queue and p["leader"]) == n

    def fed_status(self) -> dict[str, Any]:
        out = _fabric("federation", "status", "--etcd", self.urls, "--json", timeout=30)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    def create(self, queue: str, *args: str) -> dict[str, Any]:
        extra = [] if "--clusters" in args else ["--clusters", "1"]
        out = _fabric("queue", "create", queue, *args, *extra, "--etcd", self.urls, "--json", timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"fabric queue create {queue}: {out.stderr.strip()}")
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    def placement(self, queue: str) -> list[str]:
        raw = EtcdClient(self.etcd)
        try:
            kv = raw.get(f"/federation/queues/{queue}")
            return list(json.loads(kv.value)["partitions"]) if kv is not None else []
        finally:
            raw.close()


def _ok(future: Any) -> bool:
    try:
        future.result(10)
    except FabricError:
        return False
    return True


def _line(n: int, name: str, figure: str, ok: bool) -> dict[str, Any]:
    print(f"bar {n} {name}: {figure} -- {'PASS' if ok else 'FAIL'}", flush=True)
    return {"bar": n, "name": name, "figure": figure, "pass": ok}


def bar_placement(fed: Fed, loaded: str, preload: int, queues: int) -> dict[str, Any]:
    with Admin(fed.router[loaded], timeout_ms=30_000) as admin:
        admin.create_queue("soak-preload", partitions=preload)
    _wait("the preload in the loaded cluster's report", lambda: _reported(fed, loaded) >= preload, 30)
    where: dict[str, int] = dict.fromkeys(fed.clusters, 0)
    started = time.monotonic()
    for i in range(queues):
        doc = fed.create(f"soak-q{i:02d}", "-p", "1")
        where[doc["clusters"][0]] += 1
    took = time.monotonic() - started
    other = next(c for c in fed.clusters if c != loaded)
    ok = all(where.values()) and where[loaded] < where[other] and sum(where.values()) == queues
    fig = (
        f"{queues} queues through the manager in {took:.1f} s: {loaded} (preloaded with {preload} partitions) "
        f"{where[loaded]}, {other} {where[other]}"
    )
    return _line(1, "placement by utilisation", fig, ok)


def _reported(fed: Fed, cluster: str) -> int:
    doc = fed.fed_status()
    return next(int(c["utilisation"]["partitions"]) for c in doc["clusters"] if c["name"] == cluster)


def bar_front_door(fed: Fed, n: int) -> dict[str, Any]:
    split = fed.create("soak-split", "-p", "4", "--clusters", "2")
    placement = split["placement"]
    for c in fed.clusters:
        _wait(f"soak-split's share led on {c}", lambda c=c: fed.led(c, "soak-split", 2), 30)
    figs, ok = [], True
    a, b = fed.clusters
    for k, (w, r) in enumerate(((a, b), (b, a))):
        with Producer(fed.router[w], acks="all") as prod:
            futures = [prod.send("soak-split", f"{k}:{i}".encode(), partition=i % 4) for i in range(n)]
            prod.flush(60)
            acked = {f"{k}:{i}".encode() for i, f in enumerate(futures) if _ok(f)}
            parts = {f.result().partition for f in futures if _ok(f)}
        got: set[bytes] = set()
        with Consumer("soak-split", fed.router[r], group=f"soak-fd-{k}", start="earliest") as cons:
            deadline = time.monotonic() + 60
            while not acked <= got and time.monotonic() < deadline:
                got.update(m.value for m in cons.poll(500))
            assignment = sorted(cons.assignment())
        mine = {v for v in got if v.startswith(f"{k}:".encode())}
        good = len(acked) == n and parts == {0, 1, 2, 3} and acked <= mine and assignment == [0, 1, 2, 3]
        ok = ok and good
        figs.append(
            f"written via {w}'s router {len(acked)}/{n} acked on partitions {sorted(parts)}, "
            f"read via {r}'s router {len(mine)} by one group (assignment {assignment})"
        )
    return _line(2, "front door", f"soak-split placed {placement}; " + "; ".join(figs), ok)


def bar_move(fed: Fed, parts: int, max_messages: int) -> dict[str, Any]:
    """tests/federation/test_federation_cluster.py's _move_under_load on this federation's clusters."""
    q = "soak-move"
    fed.create(q, "-p", str(parts))
    src = fed.placement(q)[0]
    dst = next(c for c in fed.clusters if c != src)
    _wait(f"{q} led on {src}", lambda: fed.led(src, q, parts), 30)
    acked: dict[int, list[int]] = {p: [] for p in range(parts)}
    offsets: dict[int, list[int]] = {p: [] for p in range(parts)}
    with Producer(fed.router[src], acks="all") as prod:
        for i in range(300):
            prod.send(q, str(i).encode(), partition=i % parts)
        prod.flush(30)
    for i in range(300):
        acked[i % parts].append(i)
    committed = {p: 100 - 10 * p for p in range(parts)}
    with Admin(fed.router[src]) as admin:
        admin.commit(q, "g", committed)
    raw = EtcdClient(fed.etcd)
    try:
        _wait("the group's commit in etcd", lambda: raw.get(f"/clusters/{src}/groups/{q}/g") is not None, 15)
    finally:
        raw.close()
    mover = subprocess.Popen(
        [sys.executable, "-m", "fabric.cli", "queue", "move", q, "--to", dst, "--etcd", fed.urls, "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    n, pauses, last_ack, bounced = 300, [], time.monotonic(), 0
    pending: list[int] = []
    deadline = time.monotonic() + 120
    errors: list[str] = []
    try:
        with Producer(fed.router[src], acks="all", retries=0) as prod:
            while time.monotonic() < deadline and n < max_messages:
                if not pending:
                    if mover.poll() is not None and n >= 300 + 150:
                        break
                    pending, n = list(range(n, n + 10)), n + 10
                to_send, pending, futures = pending, [], []
                for k, i in enumerate(to_send):
                    try:
                        futures.append((i, prod.send(q, str(i).encode(), partition=i % parts)))
                    except (QueueMoved, QueueElsewhere):  # the look-up itself redirected back: the
                        bounced += 1  # two clusters' routers disagreeing for a moment; these and
                        pending.extend(to_send[k:])  # the rest sent again, in order
                        break
                for i, f in futures:
                    try:
                        offsets[i % parts].append(f.result(10).offset)  # type: ignore[arg-type]
                        acked[i % parts].append(i)
                    except (QueueMoved, QueueElsewhere):
                        pending.append(i)
                    except FabricError as exc:  # counted, not re-sent: it may be stored
                        errors.append(repr(exc))
                if pending:
                    time.sleep(0.02)
                    continue
                now = time.monotonic()
                pauses.append(now - last_ack)
                last_ack = now
    finally:
        try:
            out, err = mover.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            mover.kill()
            out, err = mover.communicate()
    moved = mover.returncode == 0 and out.rstrip().endswith("done")
    lost = dups = disorder = 0
    group_ok = False
    if moved:
        _wait(f"{q} led on {dst}", lambda: fed.led(dst, q, parts), 30)
        with Admin(fed.router[dst]) as admin:
            group_ok = admin.committed(q, "g") == committed
            for p in range(parts):
                got: list[int] = []
                end = time.monotonic() + 60
                while time.monotonic() < end:
                    batches, _ = admin.fetch(q, p, len(got))
                    if not batches:
                        break
                    got += [int(v) for b in batches for v in b.values]
                lost += len(set(acked[p]) - set(got))
                dups += len(got) - len(set(got))
                disorder += sum(1 for x, y in itertools.pairwise(got) if y < x)
        with Consumer(q, fed.router[dst], group="g", auto_commit=False) as consumer:
            first: dict[int, int] = {}
            end = time.monotonic() + 30
            while len(first) < parts and time.monotonic() < end:
                for m in consumer.poll(500):
                    first.setdefault(m.partition, m.offset)
        group_ok = group_ok and first == committed
    worst = max(pauses, default=0.0)
    total = sum(len(v) for v in acked.values())
    ok = moved and not lost and not dups and not disorder and group_ok and worst < 2.0 and not pending and not errors
    phases = " -> ".join(line.rsplit(": ", 1)[-1] for line in out.splitlines()) or err.strip()[-300:]
    fig = (
        f"{q} ({parts} partitions) {src} -> {dst} ({phases}); acknowledged {total}, lost {lost}, duplicates {dups}, "
        f"out of order {disorder}, group from its offsets {'yes' if group_ok else 'NO'}, longest pause "
        f"{worst:.2f} s, unsent {len(pending)}, send() refused by a look-up redirected back {bounced}, "
        f"errors {len(errors)}{' ' + errors[0] if errors else ''}"
    )
    return _line(4, "move under load", fig, ok)


def _latencies(router: str, queue: str, n: int) -> list[float]:
    """``n`` acks=all single sends, each waited for: their latencies in ms, in order."""
    lat = []
    with Producer(router, acks="all", linger_ms=0) as prod:
        prod.send(queue, b"warm").result(10)
        for i in range(n):
            t = time.perf_counter()
            prod.send(queue, b"%d" % i).result(10)
            lat.append((time.perf_counter() - t) * 1000)
    return lat


def _p99(lat: list[float]) -> float:
    return statistics.quantiles(lat, n=100)[98]


def bar_cluster_lost(fed: Fed, lost: str, samples: int, messages: int) -> dict[str, Any]:
    kept = next(c for c in fed.clusters if c != lost)
    # a queue on each cluster, from bar 1's
    keep_q = next(f"soak-q{i:02d}" for i in range(100) if fed.placement(f"soak-q{i:02d}") == [kept])
    lost_q = next(f"soak-q{i:02d}" for i in range(100) if fed.placement(f"soak-q{i:02d}") == [lost])
    for c, q in ((kept, keep_q), (lost, lost_q)):
        _wait(f"{q} led on {c}", lambda c=c, q=q: fed.led(c, q, 1), 30)
    with Producer(fed.router[kept], acks="all") as prod:
        futures = [prod.send(lost_q, b"%d" % i) for i in range(messages)]
        prod.flush(60)
    acked = {b"%d" % i for i, f in enumerate(futures) if _ok(f)}
    before = _p99(_latencies(fed.router[kept], keep_q, samples))

    sup = fed.supervisor[lost]
    pids = {n: int((fed.data_dir[lost] / "pids" / f"{n}.pid").read_text()) for n in fed.nodes[lost]}
    os.kill(sup, signal.SIGSTOP)  # it would restart its stores after 1 s
    resumed = False
    try:
        t_kill = time.monotonic()
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        lat = _latencies(fed.router[kept], keep_q, samples)
        during, halves = _p99(lat), (_p99(lat[: samples // 2]), _p99(lat[samples // 2 :]))
        during_s = time.monotonic() - t_kill
        # a write to the lost cluster's queue, through the living cluster's router
        with Producer(fed.router[kept], acks="all", retries=2) as prod:
            t = time.monotonic()
            try:
                prod.send(lost_q, b"after").result(30)
                refusal = "accepted (no error)"
            except FabricError as exc:
                refusal = f"{type(exc).__name__}: {exc.message}"
            refused_s = time.monotonic() - t
        refused_ok = "CLUSTER_UNAVAILABLE" in refusal.upper() or "ClusterUnavailable" in refusal
        refused_ok = refused_ok and lost in refusal and refused_s < 8
        # the planner drops the lost cluster once its report is stale; a new queue then goes to the other
        _wait(
            f"{lost} out of the planner",
            lambda: not next(c for c in fed.fed_status()["clusters"] if c["name"] == lost)["accepts_queues"],
            60,
        )
        out_s = time.monotonic() - t_kill
        try:
            new_where = fed.create("soak-new", "-p", "1")["clusters"]
        except RuntimeError as exc:
            new_where = [str(exc)]
        os.kill(sup, signal.SIGCONT)
        resumed = True
        t_back = time.monotonic()
        back_s = _wait(f"{lost_q} led again on {lost}", lambda: fed.led(lost, lost_q, 1), 120)
        # read the lost cluster's queue back whole
        got: set[bytes] = set()
        with Admin(fed.router[lost]) as admin:
            end = time.monotonic() + 60
            while time.monotonic() < end:
                try:
                    batches, _ = admin.fetch(lost_q, 0, len(got))
                except FabricError:
                    time.sleep(0.5)
                    continue
                if not batches:
                    break
                got.update(v for b in batches for v in b.values)
        with Producer(fed.router[kept], acks="all") as prod:
            prod.send(lost_q, b"resumed").result(30)
        resumed_s = time.monotonic() - t_back
    finally:
        if not resumed:
            os.kill(sup, signal.SIGCONT)
    missing = len(acked - got)
    ratio = during / before if before else float("inf")
    ok = ratio <= 1.5 and refused_ok and new_where == [kept] and not missing and len(acked) == messages
    fig = (
        f"every store of {lost} killed: {keep_q} on {kept} p99 {before:.2f} ms before, {during:.2f} ms during "
        f"(x{ratio:.2f}, bar 1.5; {samples} acks=all sends each; the sends during took {during_s:.1f} s from the kill, p99 of "
        f"their first half {halves[0]:.2f} ms, second half {halves[1]:.2f} ms); a send to {lost_q} on {lost}: {refusal!r} "
        f"in {refused_s:.2f} s; {lost} out of the planner {out_s:.1f} s after the kill, soak-new placed on "
        f"{new_where}; {lost} back {back_s:.1f} s after its supervisor resumed, {lost_q} writable "
        f"{resumed_s:.1f} s after; acknowledged before the kill {len(acked)}, read back {len(got & acked)}, "
        f"lost {missing}"
    )
    return _line(3, "cluster lost", fig, ok)


def bar_bench(messages: int, runs: int, stores: int) -> dict[str, Any]:
    out = _fabric(
        "bench-cluster", "--federation", "-n", str(messages), "--runs", str(runs), "--stores", str(stores),
        "--rf", str(stores), "--json", timeout=900,
    )  # fmt: skip
    if out.returncode != 0:
        return _line(5, "throughput", f"fabric bench-cluster failed: {out.stderr.strip()[-300:]}", False)
    r = json.loads(out.stdout[out.stdout.index("{") :])  # --json: one indented document
    fig = (
        f"fabric bench-cluster --federation -n {messages} --runs {runs} --stores {stores} --rf {stores}: "
        f"through its own routers {r['routers_msgs_per_s']:,} msg/s, through the other cluster's router "
        f"{r['federation_msgs_per_s']:,} msg/s (ratio {r['federation_ratio']:.2f}, bar 0.90)"
    )
    return _line(5, "throughput", fig, r["federation_ratio"] >= 0.9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(CONFIGS / "federation-2x3.toml"))
    ap.add_argument("--stores", type=int, choices=(1, 3), default=3, help="1: one store per cluster, RF 1")
    ap.add_argument(
        "--report-ms", type=int, default=None, help="each cluster's federation_report_ms (default: the config's)"
    )
    ap.add_argument("--seed", type=int, default=None, help="which cluster is preloaded and which is lost")
    ap.add_argument("--queues", type=int, default=20, help="queues made through the manager (bar 1)")
    ap.add_argument("--preload", type=int, default=12, help="partitions made beforehand on the loaded cluster")
    ap.add_argument("--messages", type=int, default=400, help="messages per direction (bar 2), acked before (bar 3)")
    ap.add_argument("--samples", type=int, default=300, help="single sends per p99 (bar 3)")
    ap.add_argument("--move-max", type=int, default=20_000, help="at most this many messages in the move's load")
    ap.add_argument("--bench", action="store_true", help="then bar 5: fabric bench-cluster --federation")
    ap.add_argument("--bench-messages", type=int, default=50_000)
    ap.add_argument("--bench-runs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout at the end")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="fabric-fedsoak-"))
    config = Path(args.config).resolve()
    if args.stores == 1 or args.report_ms is not None:
        config = _variant(root, config, args.stores, args.report_ms)
    fed_cfg = tomllib.loads(config.read_text())
    cluster_cfgs = {}
    for rel in fed_cfg["federation"]["clusters"]:
        c = tomllib.loads((config.parent / rel).read_text())["cluster"]
        cluster_cfgs[c["name"]] = c
    reports = sorted({int(c.get("federation_report_ms", 0)) for c in cluster_cfgs.values()})
    print(f"federation soak: seed {seed}, {config} in {root}", file=sys.stderr)
    stores = {name: len(c["nodes"]) for name, c in cluster_cfgs.items()}
    print(f"federation: {config.name}, stores per cluster {stores}, federation_report_ms {reports}", flush=True)
    sup = subprocess.Popen(
        [sys.executable, "-m", "fabric.cli", "up", "--config", str(config), "--json", "--ready-timeout", "90"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=open(root / "up.log", "wb"),  # noqa: SIM115 - lives as long as the federation
    )
    results: list[dict[str, Any]] = []
    try:
        assert sup.stdout is not None
        line = sup.stdout.readline()
        if not line:
            raise SystemExit(f"federation soak: fabric up exited before ready (see {root / 'up.log'})")
        fed = Fed(json.loads(line), cluster_cfgs)
        _wait(
            "a manager and every cluster taking queues",
            lambda: (d := fed.fed_status())["manager"] is not None and all(c["accepts_queues"] for c in d["clusters"]),
            60,
        )
        loaded = rng.choice(fed.clusters)
        results.append(bar_placement(fed, loaded, args.preload, args.queues))
        results.append(bar_front_door(fed, args.messages))
        results.append(bar_move(fed, 3, args.move_max))
        _wait(
            "every cluster taking queues again",
            lambda: all(c["accepts_queues"] for c in fed.fed_status()["clusters"]),
            60,
        )
        results.append(bar_cluster_lost(fed, rng.choice(fed.clusters), args.samples, args.messages))
    finally:
        sup.send_signal(signal.SIGTERM)
        try:
            sup.wait(90)
        except subprocess.TimeoutExpired:
            sup.kill()
    if args.bench:
        results.append(bar_bench(args.bench_messages, args.bench_runs, args.stores))
    if args.json:
        doc = {"seed": seed, "stores": stores, "federation_report_ms": reports, "config": str(config), "bars": results}
        print(json.dumps(doc))
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
