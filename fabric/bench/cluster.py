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
Every loop is bounded by a message count and a deadline; only processes this command started are
stopped, by their PID.
"""

from __future__ import annotations

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


FEDERATION_REPORT_MS = 500


def _config(root: Path, stores: int, routers: int, rf: int, federation: bool = False) -> Path:
    ports = free_ports(6 + stores + routers)
    etcd = [(f"http://127.0.0.1:{ports[i]}", f"http://127.0.0.1:{ports[3 + i]}") for i in range(3)]
    fed = f"federation_report_ms = {FEDERATION_REPORT_MS}\n" if federation else ""
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
            f'data_dir = "{root / f"store-{i + 1}"}"\n\n'
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
    front: Any = None
    watcher = threading.Thread(target=sup.watch, daemon=True)
    try:
        sup.start()
        watcher.start()
        router_list = ",".join(r.listen for r in config.cluster.routers)
        node_list = ",".join(n.listen for n in config.cluster.nodes)
        queue = "bench"
        partitions = stores
        if federation:
            front_config = load_config(_front_config(root, list(config.cluster.etcd)))
            assert front_config.cluster is not None
            front = Supervisor(str(root / "front.toml"), front_config.cluster)
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
        _round(leaders, queue, min(messages, 20_000), size, acks)  # warm-up: connections, page cache
        figures: dict[str, list[float]] = {"leaders": [], "routers": [], "leader-aware": []}
        rounds = [
            ("leaders", leaders, False),
            ("routers", [router_list] * partitions, False),
            ("leader-aware", [router_list] * partitions, True),
        ]
        if federation:
            figures["federation"] = []
            rounds.append(("federation", [front_router] * partitions, False))
        for i in range(runs):
            k = i % len(rounds)
            for label, eps, aware in rounds[k:] + rounds[:k]:  # none always goes first
                rate = _round(eps, queue, messages, size, acks, aware)
                figures[label].append(rate)
                if progress:
                    print(f"  run {i + 1}: {label:12s} {rate:>10,.0f} msg/s", flush=True)
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
            if federation:
                print(
                    f"  through another cluster's router (federation): {result['federation_msgs_per_s']:>10,} msg/s"
                    f"   ({result['federation_ratio']:.0%} of through the routers)",
                    flush=True,
                )
        return result
    finally:
        if front is not None:
            front.stop()
            front.stop_all()
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
    from fabric.federation.status import request_queue

    deadline = time.monotonic() + 60
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
