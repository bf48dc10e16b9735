"""`fabric bench-cluster`: produce throughput through the router tier against straight to the
partition leaders, side by side in one run, on a cluster this command starts on loopback.

The cluster is what ``fabric up --config`` starts (3 etcd members, ``--stores`` storage nodes,
``--routers`` routers, free 127.0.0.1 ports, data in a temporary directory removed at the end).
One queue with one partition per producer, replication factor ``--rf``. Each round runs one
producer process per partition, each sending its share of ``--messages`` to its own partition
with the given acks, and times the whole (first send to last acknowledgement, one monotonic
clock). "leaders": each producer connects to its partition's leader (found with METADATA).
"routers": each producer is given every router's endpoint (it uses one, picked at random).
"leader-aware": each producer is a ``LeaderProducer`` given only the routers: it reads the map
through them and sends straight to its partition's leader. Each run does one round of each, the
order rotating from run to run; the median of each is reported, and the ratios.
With ``--federation`` the cluster joins a federation with a second one started beside it on the
same etcd ("front": one store, one router), the queue is placed on the measured cluster by the
federation manager, and a fourth round, "federation", gives each producer only the front
cluster's router: its look-up is redirected (QUEUE_ELSEWHERE) and it sends through the measured
cluster's routers (docs/federation.md, "One front door"); its ratio is to "routers".

``--mode latency``: one producer, partition 0, one message per ``send()`` at ``--rate`` a second
for ``--seconds`` (``linger_ms=0``), each acknowledgement timed from its send (the producer's
callback, one monotonic clock): p50, p99, max, and the longest gap between two
acknowledgements (a stall), through the routers, straight to the leader, and to a single node
(``fabric up``, the same fsync) started beside the cluster, rounds interleaved.
Every loop is bounded by a message count and a deadline; only processes this command started are
stopped, by their PID.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fabric.testing import free_ports

RUN_SECONDS_MAX = 120


def _produce(endpoint: str, queue: str, partition: int, n: int, size: int, acks: str, out: Any, aware: bool) -> None:
    from fabric.client import LeaderProducer, Producer

    payload = b"x" * size
    deadline = time.monotonic() + RUN_SECONDS_MAX
    kind = LeaderProducer if aware else Producer
    with kind(endpoint, acks=acks, linger_ms=5) as p:
        t0 = time.monotonic_ns()
        sent = 0
        while sent < n and time.monotonic() < deadline:
            for _ in range(min(10_000, n - sent)):
                p.send(queue, payload, partition=partition)
            sent += min(10_000, n - sent)
        p.flush(60)
        out.put({"sent": sent, "t0": t0, "t1": time.monotonic_ns()})


def _latency(
    endpoint: str, queue: str, partition: int, rate: int, seconds: float, size: int, acks: str, out: Any
) -> None:
    from fabric.client import Producer

    payload = b"x" * size
    n = int(rate * seconds)
    lat: list[int] = []
    acked: list[int] = []
    errors = [0]
    with Producer(endpoint, acks=acks, linger_ms=0) as p:
        p.send(queue, payload, partition=partition).result(30)  # connected, the partition known

        def done(sent_ns: int) -> Any:
            def cb(meta: Any, err: Any) -> None:
                t = time.monotonic_ns()
                if err is not None:
                    errors[0] += 1
                    return
                lat.append(t - sent_ns)
                acked.append(t)

            return cb

        t0 = time.monotonic()
        deadline = t0 + RUN_SECONDS_MAX
        for i in range(n):
            due = t0 + i / rate
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            elif now > deadline:
                break
            p.send(queue, payload, partition=partition, callback=done(time.monotonic_ns()))
        p.flush(60)
    out.put({"lat": lat, "acked": sorted(acked), "errors": errors[0]})


def _latency_round(endpoint: str, queue: str, rate: int, seconds: float, size: int, acks: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    pr = ctx.Process(target=_latency, args=(endpoint, queue, 0, rate, seconds, size, acks, out))
    pr.start()
    res = out.get(timeout=RUN_SECONDS_MAX + 30)
    pr.join(30)
    lat = sorted(res["lat"])
    warm = res["acked"][len(res["acked"]) // 20 :]  # the first 5% warm up
    gaps = [b - a for a, b in itertools.pairwise(warm)]

    def at(q: float) -> float:
        return round(lat[min(len(lat) - 1, int(q * len(lat)))] / 1e6, 2) if lat else 0.0

    return {
        "acked": len(lat),
        "errors": res["errors"],
        "mean_ms": round(sum(lat) / len(lat) / 1e6, 2) if lat else 0.0,
        "p50_ms": at(0.50),
        "p99_ms": at(0.99),
        "p999_ms": at(0.999),
        "max_ms": at(1.0),
        "stall_ms": round(max(gaps, default=0) / 1e6, 1),
    }


def _round(endpoints: list[str], queue: str, n: int, size: int, acks: str, aware: bool = False) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    share = n // len(endpoints)
    procs = [
        ctx.Process(target=_produce, args=(e, queue, p, share, size, acks, out, aware)) for p, e in enumerate(endpoints)
    ]
    for pr in procs:
        pr.start()
    results = [out.get(timeout=RUN_SECONDS_MAX + 30) for _ in procs]
    for pr in procs:
        pr.join(30)
    sent = sum(r["sent"] for r in results)
    elapsed = (max(r["t1"] for r in results) - min(r["t0"] for r in results)) / 1e9
    return sent / elapsed


def _latency_rounds(
    root: Path,
    routers: str,
    leader: str,
    metrics: dict[str, str],
    queue: str,
    rate: int,
    seconds: float,
    size: int,
    acks: str,
    runs: int,
    rf: int,
    progress: bool,
) -> dict[str, Any]:
    """Latency rounds through the routers, straight to partition 0's leader, and to a single node
    started here, interleaved (the order rotating), each ``seconds`` long at ``rate``."""
    from fabric.client import Admin
    from fabric.testing import Node

    single = Node(str(root / "single"))
    try:
        with Admin(single.endpoint, timeout_ms=5000) as admin:
            admin.create_queue(queue, partitions=1, if_not_exists=True)
        rounds = [("routers", routers), ("leader", leader), ("single node", single.endpoint)]
        figures: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in rounds}
        for _, ep in rounds:  # warm-up: connections, page cache
            _latency_round(ep, queue, rate, 1.0, size, acks)
        stages: dict[str, list[dict[str, float]]] = {"routers": [], "leader": []}
        for i in range(runs):
            for label, ep in rounds[i % 3 :] + rounds[: i % 3]:
                before = _scrape(metrics, leader) if label in stages else None
                r = _latency_round(ep, queue, rate, seconds, size, acks)
                figures[label].append(r)
                if before is not None:
                    stages[label].append(_stages(before, _scrape(metrics, leader)))
                if progress:
                    print(
                        f"  run {i + 1}: {label:12s} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
                        f"max {r['max_ms']:8.1f} ms  longest gap {r['stall_ms']:7.1f} ms  ({r['acked']:,} acked)",
                        flush=True,
                    )
        med = {
            label: {k: statistics.median(r[k] for r in rs) for k in ("p50_ms", "p99_ms", "max_ms", "stall_ms")}
            for label, rs in figures.items()
        }
        if progress:
            print(
                f"cluster latency: RF {rf}, acks={acks}, {size} B, {rate:,} msg/s for {seconds:g} s, "
                f"one producer, one partition, median of {runs}",
                flush=True,
            )
            for label, m in med.items():
                print(
                    f"  {label:12s} p50 {m['p50_ms']:7.2f} ms  p99 {m['p99_ms']:7.2f} ms  max {m['max_ms']:8.1f} ms"
                    f"  longest gap {m['stall_ms']:7.1f} ms",
                    flush=True,
                )
        where = _where(figures, stages)
        if progress:
            print(
                "where a replicated message's time goes (ms; means from the nodes' histograms, medians over runs;"
                " router = through the routers less straight to the leader):",
                flush=True,
            )
            for stage, ms in where.items():
                print(f"  {stage:44s} {ms:7.2f}", flush=True)
        return {
            "where_ms": where,
            "mode": "latency",
            "rate": rate,
            "seconds": seconds,
            "size": size,
            "acks": acks,
            "replication_factor": rf,
            "runs": runs,
            "median": med,
            "all": figures,
        }
    finally:
        single.stop()


STAGES = (  # (name in the output, metric, labels, on the leader or the followers)
    ("leader: PRODUCE handled (append)", "fabric_request_duration_seconds", 'op="produce"', True),
    ("leader: fdatasync", "fabric_fsync_duration_seconds", "", True),
    ("follower: fetch round trip (append, 2 hops)", "fabric_replication_stage_seconds", 'stage="follower_fetch"', True),
    ("follower: fdatasync (not waited for)", "fabric_fsync_duration_seconds", "", False),
    ("leader: durable -> acks=all reply (ISR, HW)", "fabric_replication_stage_seconds", 'stage="isr_wait"', True),
)


def _scrape(metrics: dict[str, str], leader: str) -> dict[tuple[str, bool], tuple[float, float]]:
    """(sum, count) of each STAGES histogram, on the leader and summed over the followers."""
    import urllib.request

    out: dict[tuple[str, bool], tuple[float, float]] = {}
    for listen, hostport in metrics.items():
        if not hostport:
            continue
        with urllib.request.urlopen(f"http://{hostport}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("fabric_") and (
                "_sum" in line or "_count" in line or "replica_fetch" in line or "gc_pause_seconds_bucket" in line
            ):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        on_leader = listen == leader
        if on_leader:
            out[("fetches", True)] = (values.get('fabric_requests_total{op="replica_fetch"}', 0.0), 0.0)
        # collector pauses of 50 ms or more (the histogram is cumulative): a stall's suspect
        slow = sum(
            v - values.get(k.replace('le="+Inf"', 'le="0.05"'), 0.0)
            for k, v in values.items()
            if k.startswith("fabric_gc_pause_seconds_bucket") and 'le="+Inf"' in k
        )
        gc_key = "gc_leader" if on_leader else "gc_followers"
        out[(gc_key, on_leader)] = (out.get((gc_key, on_leader), (0.0, 0.0))[0] + slow, 0.0)
        for stage, metric, labels, where in STAGES:
            if where != on_leader:
                continue
            sel = "{" + labels + "}" if labels else ""
            total = values.get(f"{metric}_sum{sel}", 0.0)
            count = values.get(f"{metric}_count{sel}", 0.0)
            old = out.get((stage, on_leader), (0.0, 0.0))
            out[(stage, on_leader)] = (old[0] + total, old[1] + count)
    return out


def _stages(before: dict[Any, tuple[float, float]], after: dict[Any, tuple[float, float]]) -> dict[str, float]:
    """Each stage's mean in ms over one round."""
    out = {}
    for key, (total, count) in after.items():
        t0, c0 = before.get(key, (0.0, 0.0))
        if key[0] in ("fetches", "gc_leader", "gc_followers"):  # counters
            out[key[0]] = total - t0
            continue
        out[key[0]] = round((total - t0) / (count - c0) * 1000, 3) if count > c0 else 0.0
    return out


def _where(figures: dict[str, list[dict[str, Any]]], stages: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    """Where the time goes, medians over the runs: the nodes' stages (from the rounds straight to
    the leader), the router hop (the rounds through the routers less those), and what is left of
    the producer's mean (its own sends and receives, the hops, waits for a CPU)."""
    out: dict[str, float] = {}
    for stage, *_ in STAGES:
        vals = [r[stage] for r in stages["leader"] if stage in r]
        out[stage] = round(statistics.median(vals), 2) if vals else 0.0
    per = [r["fetches"] / f["acked"] for r, f in zip(stages["leader"], figures["leader"], strict=True) if f["acked"]]
    fetches_per_message = round(statistics.median(per), 3) if per else 0.0
    mean_leader = statistics.median(r["mean_ms"] for r in figures["leader"])
    mean_routers = statistics.median(r["mean_ms"] for r in figures["routers"])
    on_nodes = out[STAGES[0][0]] + out[STAGES[1][0]] + out[STAGES[4][0]]
    out["router hop (routers less leader, mean)"] = round(mean_routers - mean_leader, 2)
    out["producer, hops, CPU waits (the rest)"] = round(mean_leader - on_nodes, 2)
    out["total, straight to the leader (mean)"] = round(mean_leader, 2)
    out["total, through the routers (mean)"] = round(mean_routers, 2)
    out["REPLICA_FETCHes at the leader per message"] = fetches_per_message
    rounds = stages["leader"] + stages["routers"]
    out["GC pauses >= 50 ms, leader (all rounds)"] = sum(r.get("gc_leader", 0.0) for r in rounds)
    out["GC pauses >= 50 ms, followers (all rounds)"] = sum(r.get("gc_followers", 0.0) for r in rounds)
    return out


FEDERATION_REPORT_MS = 500


def _config(root: Path, stores: int, routers: int, rf: int, federation: bool = False) -> Path:
    ports = free_ports(6 + 2 * stores + routers)
    fed = f"federation_report_ms = {FEDERATION_REPORT_MS}\n" if federation else ""
    etcd = [(f"http://127.0.0.1:{ports[i]}", f"http://127.0.0.1:{ports[3 + i]}") for i in range(3)]
    text = (
        f'[node]\nlog_level = "warning"\nauto_create_queues = false\n\n[cluster]\nname = "bench"\n'
        f'data_dir = "{root / "sup"}"\nreplication_factor = {rf}\nmin_insync_replicas = {min(2, rf)}\n{fed}\n'
    )
    for i, (client, peer) in enumerate(etcd):
        text += (
            f'[[cluster.etcd_members]]\nname = "etcd-{i + 1}"\nclient_url = "{client}"\npeer_url = "{peer}"\n'
            f'data_dir = "{root / f"etcd-{i + 1}"}"\n\n'
        )
    for i in range(stores):
        text += (
            f'[[cluster.nodes]]\nid = "store-{i + 1}"\nlisten = "tcp://127.0.0.1:{ports[6 + i]}"\n'
            f'data_dir = "{root / f"store-{i + 1}"}"\nmetrics_listen = "127.0.0.1:{ports[6 + stores + routers + i]}"\n\n'
        )
    for i in range(routers):
        text += f'[[cluster.routers]]\nid = "router-{i + 1}"\nlisten = "tcp://127.0.0.1:{ports[6 + stores + i]}"\n\n'
    path = root / "cluster.toml"
    path.write_text(text)
    return path


def _front_config(root: Path, etcd: list[str]) -> Path:
    """The federation's second cluster: one store and one router on the measured cluster's etcd."""
    ports = free_ports(2)
    urls = ", ".join(f'"{u}"' for u in etcd)
    text = (
        f'[node]\nlog_level = "warning"\nauto_create_queues = false\n\n[cluster]\nname = "front"\n'
        f'etcd = [{urls}]\ndata_dir = "{root / "front-sup"}"\nreplication_factor = 1\nmin_insync_replicas = 1\n'
        f"federation_report_ms = {FEDERATION_REPORT_MS}\n\n"
        f'[[cluster.nodes]]\nid = "front-1"\nlisten = "tcp://127.0.0.1:{ports[0]}"\ndata_dir = "{root / "front-1"}"\n\n'
        f'[[cluster.routers]]\nid = "front-router-1"\nlisten = "tcp://127.0.0.1:{ports[1]}"\n'
    )
    path = root / "front.toml"
    path.write_text(text)
    return path


def run_cluster_bench(
    *,
    messages: int,
    size: int,
    acks: str,
    stores: int,
    routers: int,
    rf: int,
    runs: int,
    progress: bool = True,
    mode: str = "throughput",
    rate: int = 5000,
    seconds: float = 10.0,
    single: bool = False,
    partitions: int = 0,
    federation: bool = False,
) -> dict[str, Any]:
    from fabric.client import Admin
    from fabric.cluster.supervisor import Supervisor
    from fabric.settings import load_config

    root = Path(tempfile.mkdtemp(prefix="fabric-bench-cluster-"))
    config_path = _config(root, stores, routers, rf, federation)
    config = load_config(config_path)
    assert config.cluster is not None
    sup = Supervisor(str(config_path), config.cluster)
    watcher = threading.Thread(target=sup.watch, daemon=True)
    stack = contextlib.ExitStack()  # what the rounds started beside the cluster (a single node, a front cluster)
    try:
        sup.start()
        watcher.start()
        router_list = ",".join(r.listen for r in config.cluster.routers)
        node_list = ",".join(n.listen for n in config.cluster.nodes)
        queue = "bench"
        partitions = partitions or stores
        if federation:
            front_config = load_config(_front_config(root, list(config.cluster.etcd)))
            assert front_config.cluster is not None
            front = Supervisor(str(root / "front.toml"), front_config.cluster)
            stack.callback(front.stop_all)
            stack.callback(front.stop)
            _drain_front(list(config.cluster.etcd))  # else, with rf 1, the front may report first and take it
            front.start()
            front_router = front_config.cluster.routers[0].listen
            _place(list(config.cluster.etcd), queue, partitions, rf)
        deadline = time.monotonic() + 60
        while True:
            try:
                with Admin(node_list, timeout_ms=5000) as admin:
                    if not federation:
                        admin.create_queue(queue, partitions=partitions, replication_factor=rf, if_not_exists=True)
                    meta = admin.metadata([queue])
                parts = sorted(meta["queues"].get(queue, []), key=lambda x: x["partition"])
                if len(parts) == partitions and all(x["leader"] in meta["nodes"] for x in parts):
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.5)
        leaders = [meta["nodes"][x["leader"]] for x in parts]
        time.sleep(1.0)  # every replica has taken its role
        if mode == "latency":
            metrics = {n.listen: n.metrics_listen for n in config.cluster.nodes}
            return _latency_rounds(
                root, router_list, leaders[0], metrics, queue, rate, seconds, size, acks, runs, rf, progress
            )
        _round(leaders, queue, min(messages, 20_000), size, acks)  # warm-up: connections, page cache
        figures: dict[str, list[float]] = {"leaders": [], "routers": [], "leader-aware": []}
        rounds = [
            ("leaders", leaders, False),
            ("routers", [router_list] * partitions, False),
            ("leader-aware", [router_list] * partitions, True),
        ]
        if single:  # a single node (fabric up) beside the cluster, the same partitions and producers
            from fabric.testing import Node

            alone = Node(str(root / "single"))
            stack.callback(alone.stop)
            with Admin(alone.endpoint, timeout_ms=5000) as admin:
                admin.create_queue(queue, partitions=partitions, if_not_exists=True)
            _round([alone.endpoint] * partitions, queue, min(messages, 20_000), size, acks)
            figures["single node"] = []
            rounds.append(("single node", [alone.endpoint] * partitions, False))
        if federation:
            figures["federation"] = []
            rounds.append(("federation", [front_router] * partitions, False))
        n = len(rounds)
        for i in range(runs):
            for label, eps, aware in rounds[i % n :] + rounds[: i % n]:  # none always goes first
                got = _round(eps, queue, messages, size, acks, aware)
                figures[label].append(got)
                if progress:
                    print(f"  run {i + 1}: {label:12s} {got:>10,.0f} msg/s", flush=True)
        leaders_med = statistics.median(figures["leaders"])
        routers_med = statistics.median(figures["routers"])
        aware_med = statistics.median(figures["leader-aware"])
        result = {
            "messages": messages,
            "size": size,
            "acks": acks,
            "stores": stores,
            "routers": routers,
            "replication_factor": rf,
            "partitions": partitions,
            "runs": runs,
            "leaders_msgs_per_s": round(leaders_med),
            "routers_msgs_per_s": round(routers_med),
            "leader_aware_msgs_per_s": round(aware_med),
            "ratio": round(routers_med / leaders_med, 3),
            "leader_aware_ratio": round(aware_med / leaders_med, 3),
            "all": {k: [round(v) for v in vs] for k, vs in figures.items()},
        }
        single_med = statistics.median(figures["single node"]) if single else None
        if single_med:
            result["single_node_msgs_per_s"] = round(single_med)
            result["routers_to_single_node"] = round(routers_med / single_med, 3)
        if federation:
            fed_med = statistics.median(figures["federation"])
            result["federation_msgs_per_s"] = round(fed_med)
            result["federation_ratio"] = round(fed_med / routers_med, 3)
        if progress:  # else (--json) the returned figures are all
            print(
                f"cluster bench: {stores} stores, {routers} routers, RF {rf}, acks={acks}, {size} B, "
                f"{partitions} producers x 1 partition, median of {runs}\n"
                f"  straight to the leaders: {leaders_med:>10,.0f} msg/s\n"
                f"  through the routers:     {routers_med:>10,.0f} msg/s   ({routers_med / leaders_med:.0%} of direct)\n"
                f"  leader-aware (routers as bootstrap): {aware_med:>10,.0f} msg/s   ({aware_med / leaders_med:.0%} of direct)",
                flush=True,
            )
            if single_med:
                print(
                    f"  a single node (RF 1):    {single_med:>10,.0f} msg/s   (routers: {routers_med / single_med:.2f}x it)",
                    flush=True,
                )
            if federation:
                print(
                    f"  through another cluster's router (federation): {result['federation_msgs_per_s']:>10,} msg/s"
                    f"   ({result['federation_ratio']:.0%} of through the routers)",
                    flush=True,
                )
        return result
    finally:
        stack.close()
        sup.stop()
        sup.stop_all()
        shutil.rmtree(root, ignore_errors=True)


def _drain_front(etcd: list[str]) -> None:
    """The front cluster marked drained (`fabric federation drain front`): the manager places no
    queue on it, whichever cluster reports first."""
    from fabric.cluster.etcd import EtcdClient
    from fabric.federation.directory import drain_key

    deadline = time.monotonic() + 30
    while True:
        meta = EtcdClient(etcd)
        try:
            meta.put(drain_key("front"), b"{}")
            return
        except Exception:  # etcd not answering yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
        finally:
            meta.close()


def _place(etcd: list[str], queue: str, partitions: int, rf: int) -> None:
    """The bench queue through the federation manager, on the measured cluster (the front cluster is
    drained; with rf > 1 the one-store front cluster is not eligible anyway)."""
    from fabric.cluster.etcd import EtcdClient
    from fabric.errors import QueueExists
    from fabric.federation.directory import QueuePlacement, queue_key
    from fabric.federation.status import read_federation, request_queue

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the measured cluster's report in and taking queues first
        try:
            doc = read_federation(etcd, int(time.time() * 1000))
        except Exception:  # etcd busy: look again
            doc = {"clusters": []}
        if any(c["name"] == "bench" and c["accepts_queues"] for c in doc["clusters"]):
            break
        time.sleep(0.5)
    while True:
        try:
            request_queue(etcd, queue, {"partitions": partitions, "replication_factor": rf}, 1, 30)
            break
        except QueueExists:  # placed by an earlier try that timed out waiting for the clusters
            break
        except Exception:  # no manager elected yet, the clusters' reports not in yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    meta = EtcdClient(etcd)
    try:
        kv = meta.get(queue_key(queue))
    finally:
        meta.close()
    clusters = QueuePlacement.from_json(kv.value).clusters if kv is not None else ()
    if clusters != ("bench",):
        raise RuntimeError(f"the federation placed the bench queue on {clusters}, not on 'bench'")
