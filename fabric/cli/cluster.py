"""`fabric node start` and `fabric cluster status`: running and looking at a cluster."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from fabric.cli.common import JSON, Interrupted, _endpoint, _Group, _table
from fabric.cli.progress import Progress
from fabric.logs import configure as configure_logs


@click.group(cls=_Group)
def node() -> None:
    """Run one process of a cluster config (what a service manager runs on each machine)."""


def _cluster_process(config_path: str, name: str, what: str) -> Any:
    """The config of one process of a cluster config, with its logging set up under ``name``."""
    from fabric.settings import load_config

    config = load_config(config_path)
    if config.cluster is None:
        raise click.UsageError(f"{config_path} has no [cluster] table: {what}")
    configure_logs(
        config.log_level, config.log_format, name, text_format=f"%(asctime)s %(levelname)s {name} %(name)s: %(message)s"
    )
    return config


_READY_OPTS = [
    click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="When ready (registered in etcd), print one JSON line (event, version, cluster, endpoint, pid, ...) "
        "instead of the sentence: for scripts and service managers.",
    ),
    click.option(
        "--ready-file",
        type=click.Path(dir_okay=False),
        help="When ready, write the same JSON object to this file (atomically); removed at a clean stop.",
    ),
]


def _ready_opts(fn: Any) -> Any:
    for opt in reversed(_READY_OPTS):
        fn = opt(fn)
    return fn


@node.command("start")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False, exists=True))
@click.option("--node", "node_id", required=True, help="Which [[cluster.nodes]] entry this process is.")
@_ready_opts
def node_start(config_path: str, node_id: str, as_json: bool, ready_file: str | None) -> None:
    """Start storage node NODE of the cluster in CONFIG in the foreground; Ctrl-C stops it. It
    says it is ready once it is registered in etcd (the controller places replicas on it)."""
    from fabric import __version__
    from fabric.cli.ready import Announcer, run_announced
    from fabric.node.server import run

    config = _cluster_process(config_path, node_id, "start a single node with `fabric up`")
    me = config.cluster.node(node_id)
    config = config.replace(
        node_id=me.node_id,
        listen=me.listen,
        data_dir=me.data_dir,
        metrics_listen=me.metrics_listen or config.metrics_listen,
    )
    etcd = ", ".join(config.cluster.etcd)
    data = str(Path(config.data_dir).resolve())

    def announcer_for(server: Any) -> Announcer:
        def info() -> dict[str, Any]:
            return {
                "event": "ready",
                "version": __version__,
                "cluster": config.cluster.name,
                "node": node_id,
                "endpoint": server.endpoint,
                "stream_endpoint": server.stream_endpoint or None,
                "metrics_endpoint": server.metrics_endpoint or None,
                "pid": os.getpid(),
                "data_dir": data,
                "queues": len(server.store.queue_names()),
                "startup_ms": server.startup_ms,
                "recovery_dropped_bytes": sum(
                    getattr(rep, "bytes_truncated", 0) for rep in server.store.recovery_reports().values()
                ),
                "etcd": list(config.cluster.etcd),
            }

        return Announcer(
            f"node {node_id}",
            lambda: bool(server.cluster.agent.registered),
            info,
            lambda i: (
                f"fabric {__version__} cluster node {node_id} ready on {i['endpoint']} (data: {data}, etcd: {etcd})"
            ),
            as_json=as_json,
            ready_file=ready_file,
        )

    run_announced(lambda on_ready: run(config, on_ready=on_ready), announcer_for, ready_file)
    if not as_json:
        click.echo(f"fabric node {node_id} stopped cleanly.")


@click.group(cls=_Group)
def router() -> None:
    """Run a router of a cluster config: the stateless front end clients connect to."""


@router.command("start")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False, exists=True))
@click.option("--router", "router_id", required=True, help="Which [[cluster.routers]] entry this process is.")
@_ready_opts
def router_start(config_path: str, router_id: str, as_json: bool, ready_file: str | None) -> None:
    """Start router ROUTER of the cluster in CONFIG in the foreground; Ctrl-C stops it. It says it
    is ready once it is registered in etcd."""
    from fabric import __version__
    from fabric.cli.ready import Announcer, run_announced
    from fabric.router.router import run
    from fabric.settings import check_exposure

    config = _cluster_process(config_path, router_id, "a router fronts a cluster")
    me = config.cluster.router(router_id)
    check_exposure(config, f"router {router_id}", [me.listen])
    etcd = ", ".join(config.cluster.etcd)

    def announcer_for(r: Any) -> Announcer:
        def info() -> dict[str, Any]:
            return {
                "event": "ready",
                "version": __version__,
                "cluster": config.cluster.name,
                "router": router_id,
                "endpoint": r.endpoint,
                "metrics_endpoint": r.metrics_endpoint or None,
                "pid": os.getpid(),
                "stores": sorted(r.follower.route_map.nodes),
                "etcd": list(config.cluster.etcd),
            }

        def human(i: dict[str, Any]) -> str:
            metrics = f", metrics on {i['metrics_endpoint']}" if i["metrics_endpoint"] else ""
            return f"fabric {__version__} router {router_id} ready on {i['endpoint']} (etcd: {etcd}{metrics})"

        return Announcer(
            f"router {router_id}",
            lambda: bool(r.follower.registered),
            info,
            human,
            as_json=as_json,
            ready_file=ready_file,
        )

    def serve(on_ready: Any) -> None:
        run(
            me.router_id,
            me.listen,
            config.cluster,
            on_ready=on_ready,
            metrics_listen=me.metrics_listen,
            security=config.security,
        )

    run_announced(serve, announcer_for, ready_file)
    if not as_json:
        click.echo(f"fabric router {router_id} stopped cleanly.")


@click.group(cls=_Group)
def cluster() -> None:
    """Look at a cluster: nodes, controller, partitions, leaders, in-sync replicas."""


def _target(config_path: str | None, etcd_urls: str | None, cluster_name: str | None) -> tuple[list[str], str, Any]:
    """etcd URLs, cluster name and the config (None with --etcd) a cluster command works on."""
    from fabric.settings import load_config

    if etcd_urls:
        urls = [u.strip() for u in etcd_urls.split(",") if u.strip()]
        return urls, cluster_name or "default", None
    if config_path:
        config = load_config(config_path)
        if config.cluster is None:
            raise click.UsageError(f"{config_path} has no [cluster] table")
        return list(config.cluster.etcd), config.cluster.name, config.cluster
    raise click.UsageError("give --config CLUSTER.toml, --etcd URL[,URL...] or (cluster status) -e ENDPOINT")


def _where(fn: Any) -> Any:
    fn = click.option("--name", "cluster_name", default=None, help="Cluster name with --etcd (default: default).")(fn)
    fn = click.option("--etcd", "etcd_urls", help="etcd client URLs, comma-separated (instead of --config).")(fn)
    return click.option(
        "--config", "-c", "config_path", type=click.Path(dir_okay=False, exists=True), help="Cluster config."
    )(fn)


@cluster.command("status")
@_where
@click.option(
    "--endpoint",
    "-e",
    envvar="FABRIC_ENDPOINT",
    callback=_endpoint,
    help="Ask a router or store instead of etcd (env FABRIC_ENDPOINT; --config and --etcd come first).",
)
@JSON
def cluster_status(
    config_path: str | None, etcd_urls: str | None, cluster_name: str | None, endpoint: str | None, as_json: bool
) -> None:
    """Nodes and their liveness, routers, the controller, every partition's leader, epoch and
    ISR, and the replica moves under way: read from the cluster's etcd (--config, --etcd) or
    asked of a router or store (-e), which reads its own etcd view (a single node: itself)."""
    if config_path or etcd_urls or not endpoint:
        from fabric.cluster.status import read_status

        urls, name, cl = _target(config_path, etcd_urls, cluster_name)
        expected = [n.node_id for n in cl.nodes] if cl is not None else []
        expected_routers = [r.router_id for r in cl.routers] if cl is not None else []
        status = read_status(urls, name, expected, expected_routers)
    else:
        from fabric.client import Admin

        with Admin(endpoint, timeout_ms=10_000) as admin:
            status = admin.cluster_status()
    if as_json:
        click.echo(json.dumps(status))
        return
    ctl = status["controller"]
    click.echo(
        ("single node (no cluster)" if status["cluster"] is None else f"cluster {status['cluster']}")
        + ": "
        + (f"controller {ctl['name']} (epoch {ctl['epoch']})" if ctl else "no controller elected")
    )
    click.echo(
        _table(
            [
                {
                    "node": n["name"],
                    "live": "yes" if n["live"] else "NO",
                    "endpoint": n["endpoint"] or "-",
                    "epoch": n["epoch"],
                    "removable": "yes" if n.get("removable") else "",
                }
                for n in status["nodes"]
            ],
            ["node", "live", "endpoint", "epoch", "removable"],
        )
    )
    if any(n.get("removable") for n in status["nodes"]):
        click.echo(
            "removable: its replicas could move to the other live stores (replication factor and disk "
            "headroom kept); `fabric cluster shrink --dry-run` shows the plan for the one that frees the most"
        )
    if status["routers"]:
        click.echo(
            _table(
                [
                    {"router": r["name"], "live": "yes" if r["live"] else "NO", "endpoint": r["endpoint"] or "-"}
                    for r in status["routers"]
                ],
                ["router", "live", "endpoint"],
            )
        )
    rows = [
        {
            "queue": p["queue"],
            "partition": p["partition"],
            "leader": p["leader"] or "OFFLINE",
            "epoch": p["leader_epoch"],
            "isr": ",".join(p["isr"]),
            "replicas": ",".join(p["replicas"]),
            "under-replicated": "yes" if p["under_replicated"] else "",
        }
        for p in status["partitions"]
    ]
    if rows:
        click.echo(_table(rows, list(rows[0])))
    else:
        click.echo("no queues")
    if status["moves"]:
        click.echo(f"{len(status['moves'])} replica move(s) under way:")
        click.echo(_table(_move_rows(status["moves"]), ["queue", "partition", "from", "to", "phase"]))


def _move_rows(moves: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "queue": m["queue"],
            "partition": m["partition"],
            "from": ",".join(m["original"]),
            "to": ",".join(m["target"]),
            "phase": m.get("phase", "planned"),
            **({"bytes": m["bytes"]} if "bytes" in m else {}),
        }
        for m in moves
    ]


def _sizes(
    moves: list[Any], nodes: dict[str, Any], leaders: dict[tuple[str, int], str | None]
) -> dict[tuple[str, int], int]:
    """Bytes each move copies (per new replica): the partition's size on its leader (-1: unknown)."""
    from fabric.client import Admin
    from fabric.errors import FabricError

    sizes: dict[tuple[str, int], int] = {}
    details: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for m in moves:
        leader = leaders.get((m.queue, m.partition))
        endpoint = nodes[leader].endpoint if leader in nodes else None
        size = -1
        if endpoint is not None:
            try:
                if (endpoint, m.queue) not in details:
                    with Admin(endpoint, timeout_ms=5000) as admin:
                        details[(endpoint, m.queue)] = admin.describe_queue(m.queue)["partition_detail"]
                size = next(x["size_bytes"] for x in details[(endpoint, m.queue)] if x["partition"] == m.partition)
            except (FabricError, StopIteration):
                size = -1
        sizes[(m.queue, m.partition)] = size * len(m.adds) if size >= 0 else -1
    return sizes


def _run_moves(
    meta: Any, moves: list[Any], cmap: Any, dry_run: bool, wait: bool, timeout_s: float, as_json: bool, what: str
) -> None:
    """Show the moves and what each copies; then (unless --dry-run) write them, and with --wait
    follow them until the controller has carried every one out."""
    import time

    from fabric.cluster.rebalance import read_map, submit

    leaders = {k: r.leader for k, r in cmap.partitions.items()}
    sizes = _sizes(moves, cmap.nodes, leaders)
    rows = [
        {
            "queue": m.queue,
            "partition": m.partition,
            "original": list(m.original),
            "target": list(m.target),
            "bytes": sizes[(m.queue, m.partition)],
        }
        for m in moves
    ]
    total = sum(r["bytes"] for r in rows if r["bytes"] > 0)
    replicas = sum(len(r.replicas) for r in cmap.partitions.values())
    moved = sum(len(m.adds) for m in moves)
    summary = {
        "moves": rows,
        "replicas_moved": moved,
        "replicas": replicas,
        "bytes": total,
        "dry_run": dry_run,
    }
    if not as_json:
        if not moves:
            click.echo(f"{what}: nothing to move")
        else:
            click.echo(
                f"{what}: {len(moves)} partition(s), {moved} of {replicas} replicas move "
                f"({moved / max(1, replicas):.0%}), {total:,} bytes to copy"
                + (" (dry run: nothing written)" if dry_run else "")
            )
            click.echo(_table(_move_rows(rows), ["queue", "partition", "from", "to", "bytes"]))
    if dry_run or not moves:
        if as_json:
            click.echo(json.dumps(summary))
        return
    written, skipped = submit(meta, moves, int(time.time() * 1000))
    summary["written"] = len(written)
    summary["skipped"] = [f"{m.queue}/{m.partition}" for m in skipped]
    if skipped and not as_json:
        click.echo(f"{len(skipped)} partition(s) already have a move under way: left as they are")
    if wait:
        deadline = time.monotonic() + timeout_s
        mine = {(m.queue, m.partition) for m in written}
        left = set(mine)
        with Progress(as_json) as progress:
            try:
                while True:
                    left = mine & set(read_map(meta).moves)
                    if not left:
                        break
                    progress.update(f"{what}: {len(mine) - len(left)} of {len(mine)} move(s) carried out")
                    if time.monotonic() > deadline:
                        summary["unfinished"] = sorted(f"{q}/{p}" for q, p in left)
                        if as_json:
                            click.echo(json.dumps(summary))
                        raise click.ClickException(
                            f"{len(left)} move(s) not finished in {timeout_s:.0f} s (they go on)"
                        )
                    time.sleep(0.5)
            except KeyboardInterrupt:
                raise Interrupted(
                    f"{len(mine) - len(left)} of {len(mine)} move(s) carried out; the rest go on "
                    "(fabric cluster status shows them)"
                ) from None
        if not as_json:
            click.echo(f"done: {len(written)} move(s) carried out")
    elif not as_json:
        click.echo("moves written; the controller carries them out (fabric cluster status shows them)")
    if as_json:
        click.echo(json.dumps(summary))


def _open_meta(urls: list[str], name: str) -> Any:
    from fabric.cluster.etcd import EtcdClient
    from fabric.cluster.namespace import Namespaced

    return Namespaced(EtcdClient(urls), name)


_MOVE_OPTS = [
    click.option("--dry-run", is_flag=True, help="Show the moves and the bytes each copies; write nothing."),
    click.option(
        "--wait/--no-wait",
        default=False,
        help="Follow the moves until every one is carried out (a progress line on a terminal; Ctrl-C: "
        "exit 130 saying how many are done, the rest go on).",
    ),
    click.option("--timeout", "timeout_s", type=float, default=600, show_default=True, help="With --wait: seconds."),
]


def _move_opts(fn: Any) -> Any:
    for opt in reversed(_MOVE_OPTS):
        fn = opt(fn)
    return fn


@cluster.command("rebalance")
@_where
@_move_opts
@click.option("--cancel", is_flag=True, help="Cancel every move under way (replicas go back where they were).")
@JSON
def cluster_rebalance(
    config_path: str | None,
    etcd_urls: str | None,
    cluster_name: str | None,
    dry_run: bool,
    wait: bool,
    timeout_s: float,
    cancel: bool,
    as_json: bool,
) -> None:
    """Move replicas so that every partition sits where rendezvous hashing over the live nodes
    puts it (zone-aware), keeping each queue's replication factor: run it after adding a node.
    Each move adds the new replica, lets it catch up (throttled), admits it to the ISR, then drops
    the old one; no acknowledged message is lost."""
    from fabric.cluster.moves import rebalance_plan
    from fabric.cluster.rebalance import cancel_all, read_map

    urls, name, _ = _target(config_path, etcd_urls, cluster_name)
    meta = _open_meta(urls, name)
    try:
        if cancel:
            done = cancel_all(meta)
            click.echo(json.dumps({"cancelled": len(done)}) if as_json else f"cancelled {len(done)} move(s)")
            return
        cmap = read_map(meta)
        zones = {n: i.zone for n, i in cmap.nodes.items()}
        moves = [
            m
            for m in rebalance_plan(cmap.partitions, list(cmap.nodes), zones)
            if (m.queue, m.partition) not in cmap.moves
        ]
        _run_moves(meta, moves, cmap, dry_run, wait, timeout_s, as_json, "rebalance")
    finally:
        meta.close()


@cluster.command("drain")
@click.argument("node_id", metavar="NODE")
@_where
@_move_opts
@JSON
def cluster_drain(
    node_id: str,
    config_path: str | None,
    etcd_urls: str | None,
    cluster_name: str | None,
    dry_run: bool,
    wait: bool,
    timeout_s: float,
    as_json: bool,
) -> None:
    """Move every replica off NODE (each to the best-ranked live node its partition is not on);
    once done, NODE holds nothing and can be stopped."""
    from fabric.cluster.moves import drain_plan
    from fabric.cluster.rebalance import read_map

    urls, name, _ = _target(config_path, etcd_urls, cluster_name)
    meta = _open_meta(urls, name)
    try:
        cmap = read_map(meta)
        moves = [
            m
            for m in drain_plan(cmap.partitions, node_id, list(cmap.nodes))
            if (m.queue, m.partition) not in cmap.moves
        ]
        stuck = [
            k
            for k, r in cmap.partitions.items()
            if node_id in r.replicas and k not in {(m.queue, m.partition) for m in moves}
        ]
        if stuck and not as_json:
            click.echo(
                f"{len(stuck)} partition(s) cannot leave {node_id} (as many replicas as other live nodes, or a move under way)"
            )
        _run_moves(meta, moves, cmap, dry_run, wait, timeout_s, as_json, f"drain {node_id}")
    finally:
        meta.close()


@cluster.command("add-node")
@click.argument("node_id", metavar="NODE")
@_where
@_move_opts
@click.option("--join-timeout", type=float, default=60, show_default=True, help="Seconds to wait for NODE to register.")
@JSON
def cluster_add_node(
    node_id: str,
    config_path: str | None,
    etcd_urls: str | None,
    cluster_name: str | None,
    dry_run: bool,
    wait: bool,
    timeout_s: float,
    join_timeout: float,
    as_json: bool,
) -> None:
    """Bring a new node into use: wait until NODE (a [[cluster.nodes]] entry, started with
    `fabric node start`) has registered, then rebalance onto it."""
    import time

    from fabric.cluster.moves import rebalance_plan
    from fabric.cluster.rebalance import read_map

    urls, name, _ = _target(config_path, etcd_urls, cluster_name)
    meta = _open_meta(urls, name)
    try:
        deadline = time.monotonic() + join_timeout
        while True:
            cmap = read_map(meta)
            if node_id in cmap.nodes:
                break
            if time.monotonic() > deadline:
                raise click.ClickException(
                    f"node {node_id} has not registered in {join_timeout:.0f} s: start it with "
                    f"`fabric node start CONFIG --node {node_id}` first"
                )
            time.sleep(0.5)
        zones = {n: i.zone for n, i in cmap.nodes.items()}
        moves = [
            m
            for m in rebalance_plan(cmap.partitions, list(cmap.nodes), zones)
            if (m.queue, m.partition) not in cmap.moves
        ]
        _run_moves(meta, moves, cmap, dry_run, wait, timeout_s, as_json, f"add-node {node_id}")
    finally:
        meta.close()
