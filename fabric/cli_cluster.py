"""`fabric node start` and `fabric cluster status`: running and looking at a cluster."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from fabric.cli_common import JSON, _Group, _table
from fabric.logs import configure as configure_logs


@click.group(cls=_Group)
def node() -> None:
    """Run one process of a cluster config (what a service manager runs on each machine)."""


@node.command("start")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False, exists=True))
@click.option("--node", "node_id", required=True, help="Which [[cluster.nodes]] entry this process is.")
def node_start(config_path: str, node_id: str) -> None:
    """Start storage node NODE of the cluster in CONFIG in the foreground; Ctrl-C stops it."""
    from fabric import __version__
    from fabric.node.server import run
    from fabric.settings import load_config

    config = load_config(config_path)
    if config.cluster is None:
        raise click.UsageError(f"{config_path} has no [cluster] table: start a single node with `fabric up`")
    me = config.cluster.node(node_id)
    config = config.replace(
        node_id=me.node_id,
        listen=me.listen,
        data_dir=me.data_dir,
        metrics_listen=me.metrics_listen or config.metrics_listen,
    )
    configure_logs(
        config.log_level,
        config.log_format,
        node_id,
        text_format=f"%(asctime)s %(levelname)s {node_id} %(name)s: %(message)s",
    )

    def ready(server: Any) -> None:
        click.echo(
            f"fabric {__version__} cluster node {node_id} ready on {server.endpoint} "
            f"(data: {Path(config.data_dir).resolve()}, etcd: {', '.join(config.cluster.etcd)})"  # type: ignore[union-attr]
        )
        sys.stdout.flush()

    run(config, on_ready=ready)
    click.echo(f"fabric node {node_id} stopped cleanly.")


@click.group(cls=_Group)
def router() -> None:
    """Run a router of a cluster config: the stateless front end clients connect to."""


@router.command("start")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False, exists=True))
@click.option("--router", "router_id", required=True, help="Which [[cluster.routers]] entry this process is.")
def router_start(config_path: str, router_id: str) -> None:
    """Start router ROUTER of the cluster in CONFIG in the foreground; Ctrl-C stops it."""
    from fabric import __version__
    from fabric.router.router import run
    from fabric.settings import load_config

    config = load_config(config_path)
    if config.cluster is None:
        raise click.UsageError(f"{config_path} has no [cluster] table: a router fronts a cluster")
    me = config.cluster.router(router_id)
    configure_logs(
        config.log_level,
        config.log_format,
        router_id,
        text_format=f"%(asctime)s %(levelname)s {router_id} %(name)s: %(message)s",
    )

    def ready(r: Any) -> None:
        click.echo(
            f"fabric {__version__} router {router_id} ready on {r.endpoint} (etcd: {', '.join(config.cluster.etcd)})"  # type: ignore[union-attr]
        )
        sys.stdout.flush()

    run(me.router_id, me.listen, config.cluster, on_ready=ready)
    click.echo(f"fabric router {router_id} stopped cleanly.")


@click.group(cls=_Group)
def cluster() -> None:
    """Look at a cluster: nodes, controller, partitions, leaders, in-sync replicas."""


@cluster.command("status")
@click.option("--config", "-c", "config_path", type=click.Path(dir_okay=False, exists=True), help="Cluster config.")
@click.option("--etcd", "etcd_urls", help="etcd client URLs, comma-separated (instead of --config).")
@click.option("--name", "cluster_name", default=None, help="Cluster name with --etcd (default: default).")
@JSON
def cluster_status(config_path: str | None, etcd_urls: str | None, cluster_name: str | None, as_json: bool) -> None:
    """Nodes and their liveness, the controller, every partition's leader, epoch and ISR, read
    from the cluster's etcd."""
    from fabric.cluster.status import read_status
    from fabric.settings import load_config

    if etcd_urls:
        urls = [u.strip() for u in etcd_urls.split(",") if u.strip()]
        expected: list[str] = []
        expected_routers: list[str] = []
        name = cluster_name or "default"
    elif config_path:
        config = load_config(config_path)
        if config.cluster is None:
            raise click.UsageError(f"{config_path} has no [cluster] table")
        urls = list(config.cluster.etcd)
        expected = [n.node_id for n in config.cluster.nodes]
        expected_routers = [r.router_id for r in config.cluster.routers]
        name = config.cluster.name
    else:
        raise click.UsageError("give --config CLUSTER.toml or --etcd URL[,URL...]")
    status = read_status(urls, name, expected, expected_routers)
    if as_json:
        click.echo(json.dumps(status))
        return
    ctl = status["controller"]
    click.echo(
        f"cluster {status['cluster']}: "
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
                }
                for n in status["nodes"]
            ],
            ["node", "live", "endpoint", "epoch"],
        )
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
