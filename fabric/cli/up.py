"""`fabric up` (a node: the embedded single node, or every process of a cluster config) and
`fabric ping` (does a node answer)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from fabric import __version__
from fabric.cli.common import ENDPOINT, JSON, _admin, _emit
from fabric.cli.ready import announce_ready, up_cluster
from fabric.errors import FabricError
from fabric.logs import configure as configure_logs


@click.command()
@click.option("--config", "-c", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--data-dir", "-d", help="Data directory (default ./fabric-data).")
@click.option("--listen", "-l", help="Endpoint to bind (default tcp://127.0.0.1:7420; port 0 picks one).")
@click.option(
    "--stream-listen",
    help="Also serve fabric's stream transport here (fabric://host:port; port 0 picks one): "
    "clients that connect to it skip ZeroMQ's I/O threads, for the lowest latency.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), help="Logging level.")
@click.option("--log-format", type=click.Choice(["text", "json"]), help="Log lines for people or JSON lines.")
@click.option(
    "--metrics-listen",
    metavar="HOST:PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks one; [metrics] listen in a config).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="When ready, print one JSON line (event, node, endpoint, stream_endpoint, pid, data_dir, ...) "
    "instead of the sentences: for scripts.",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    help="When ready, write the same JSON object to this file (atomically); removed at a clean stop.",
)
@click.option(
    "--ready-timeout",
    "ready_timeout_s",
    type=click.FloatRange(min=1),
    default=60,
    show_default=True,
    help="With a cluster config: seconds to wait for every store, a controller and every router "
    "before giving up (exit 1, naming what is missing).",
)
def up(
    config_path: str | None,
    data_dir: str | None,
    listen: str | None,
    stream_listen: str | None,
    log_level: str | None,
    log_format: str | None,
    metrics_listen: str | None,
    as_json: bool,
    ready_file: str | None,
    ready_timeout_s: float,
) -> None:
    """Start a node: every role in one process (the embedded single node), with a cluster config
    every process it names (ready once the cluster is), with a federation config
    ([federation] clusters = [...]) every cluster it lists. Ctrl-C stops it (a cluster:
    routers, nodes, then etcd, with a progress line when stderr is a terminal)."""
    from fabric.node.server import run
    from fabric.settings import load_config

    if config_path is not None:
        from fabric.settings import load_federation_config

        clusters = load_federation_config(config_path)
        if clusters is not None:
            from fabric.cli.federation import up_federation

            up_federation(config_path, clusters, as_json, ready_file, ready_timeout_s)
            return
    config = load_config(config_path)
    if config.cluster is not None:
        up_cluster(str(config_path), config, as_json, ready_file, ready_timeout_s)
        return
    given = {
        "data_dir": data_dir,
        "listen": listen,
        "stream_listen": stream_listen,
        "log_level": log_level,
        "log_format": log_format,
        "metrics_listen": metrics_listen,
    }
    if metrics_listen:
        from fabric.settings import check_metrics_listen

        try:
            check_metrics_listen(metrics_listen, "--metrics-listen")
        except FabricError as exc:
            raise click.UsageError(exc.message) from None
    changes = {k: v for k, v in given.items() if v}
    if changes.get("listen", "").endswith(":0"):
        changes["listen"] = changes["listen"][:-2] + ":*"
    if changes.get("stream_listen") and not changes["stream_listen"].startswith("fabric://"):
        raise click.UsageError(f"--stream-listen must look like fabric://host:port, got {stream_listen!r}")
    config = config.replace(**changes)
    configure_logs(config.log_level, config.log_format, config.node_id)

    def ready(server: Any) -> None:
        reports = server.store.recovery_reports()
        dropped = sum(getattr(r, "bytes_truncated", 0) for r in reports.values()) if isinstance(reports, dict) else 0
        info = {
            "event": "ready",
            "version": __version__,
            "node": config.node_id,
            "endpoint": server.endpoint,
            "stream_endpoint": server.stream_endpoint or None,
            "metrics_endpoint": server.metrics_endpoint or None,
            "pid": os.getpid(),
            "data_dir": str(Path(config.data_dir).resolve()),
            "queues": len(server.store.queue_names()),
            "startup_ms": server.startup_ms,
            "recovery_dropped_bytes": dropped,
        }
        announce_ready(info, as_json, ready_file)
        if as_json:
            return
        click.echo(
            f"fabric {__version__} node {config.node_id} ready on {server.endpoint} "
            f"(data: {Path(config.data_dir).resolve()}, queues: {len(server.store.queue_names())}, "
            f"started in {server.startup_ms} ms, recovery dropped {dropped} bytes)"
        )
        if server.stream_endpoint:
            click.echo(f"stream transport on {server.stream_endpoint} (lowest latency: connect clients there)")
        if server.metrics_endpoint:
            click.echo(f"Prometheus metrics on {server.metrics_endpoint}")
        click.echo("Ctrl-C to stop.")
        sys.stdout.flush()

    try:
        run(config, on_ready=ready)
    finally:
        if ready_file:
            Path(ready_file).unlink(missing_ok=True)
    if not as_json:
        click.echo("fabric node stopped cleanly.")


@click.command()
@ENDPOINT
@JSON
def ping(endpoint: str, as_json: bool) -> None:
    """Check that a node answers; print its id, version and counters."""

    with _admin(endpoint, 3000) as admin:
        t0 = time.perf_counter()
        info = admin.ping()
        info["rtt_us"] = int((time.perf_counter() - t0) * 1e6)
    _emit(
        info,
        as_json,
        lambda d: f"node {d['node']} (fabric {d['version']}) at {endpoint}: {d['queues']} queues, rtt {d['rtt_us']} us",
    )
