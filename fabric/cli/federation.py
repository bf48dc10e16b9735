"""`fabric federation status`: the clusters sharing one etcd, as the federation directory holds them."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from fabric.cli.common import JSON, _Group, _table


@click.group(cls=_Group)
def federation() -> None:
    """Look at several clusters on one etcd: their health, utilisation, queues and the manager."""


def _fmt(n: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.1f}{suffix}"
    return f"{n:.0f}"


def _human(doc: dict[str, Any]) -> str:
    m = doc["manager"]
    lines = [f"federation manager: {m['name']} (epoch {m['epoch']})" if m else "federation manager: none elected"]
    rows = []
    for c in doc["clusters"]:
        h, u = c["health"], c["utilisation"]
        rows.append(
            {
                "cluster": c["name"],
                "ok": "yes" if c["accepts_queues"] else "NO",
                "stores": h["stores"],
                "ctl": h["controller"],
                "under": h["under_replicated"],
                "offline": h["offline"],
                "used": f"{u['fraction']:.0%}",
                "in B/s": _fmt(u["in_bytes_per_s"]),
                "in msg/s": _fmt(u["in_messages_per_s"]),
                "out B/s": _fmt(u["out_bytes_per_s"]),
                "out msg/s": _fmt(u["out_messages_per_s"]),
                "disk": f"{_fmt(u['disk_used_bytes'])}B/{_fmt(u['disk_used_bytes'] + u['disk_free_bytes'])}B",
                "parts": u["partitions"],
                "queues": len(c["queues"]),
                "age": f"{c['age_ms'] / 1000:.1f}s",
            }
        )
    lines.append(
        _table(
            rows,
            [
                "cluster",
                "ok",
                "stores",
                "ctl",
                "under",
                "offline",
                "used",
                "in B/s",
                "in msg/s",
                "out B/s",
                "out msg/s",
                "disk",
                "parts",
                "queues",
                "age",
            ],
        )
    )
    for c in doc["clusters"]:
        if c["problems"] or c.get("draining"):
            why = c["problems"] + (["being drained"] if c.get("draining") else [])
            lines.append(f"{c['name']}: takes no new queue: {'; '.join(why)}")
        if c["routers"]:
            lines.append(f"{c['name']} routers: {', '.join(c['routers'])}")
    if doc["queues"]:
        lines.append(
            _table(
                [
                    {"queue": q["queue"], "partitions": len(q["partitions"]), "clusters": ",".join(q["clusters"])}
                    for q in doc["queues"]
                ],
                ["queue", "partitions", "clusters"],
            )
        )
    for m in doc.get("moves", []):
        extra = f": {m['error']}" if m["error"] else ""
        lines.append(f"move of {m['queue']}: {m['source']} -> {m['destination']}: {m['phase']}{extra}")
    return "\n".join(lines)


@federation.command("status")
@click.option("--etcd", "etcd_urls", help="etcd client URLs, comma-separated (instead of --config).")
@click.option(
    "--config", "-c", "config_path", type=click.Path(dir_okay=False, exists=True), help="A cluster config (its etcd)."
)
@JSON
def federation_status(etcd_urls: str | None, config_path: str | None, as_json: bool) -> None:
    """Every cluster in the directory with its health, utilisation (0..1: the largest of disk,
    traffic and partitions over what its stores hold), whether it takes new queues and why not,
    and its queues; the elected manager; the queue table. Read from etcd (--etcd or --config)."""
    from fabric.federation.status import read_federation

    if etcd_urls:
        urls = [u.strip() for u in etcd_urls.split(",") if u.strip()]
    elif config_path:
        from fabric.settings import load_config

        config = load_config(config_path)
        if config.cluster is None:
            raise click.UsageError(f"{config_path} has no [cluster] table")
        urls = list(config.cluster.etcd)
    else:
        raise click.UsageError("give --etcd URL[,URL...] or --config CLUSTER.toml")
    doc = read_federation(urls, time.time_ns() // 1_000_000)
    click.echo(json.dumps(doc) if as_json else _human(doc))


def _urls(etcd_urls: str) -> list[str]:
    return [u.strip() for u in etcd_urls.split(",") if u.strip()]


def _carry_out(
    etcd_urls: str, drained: str | None, dry_run: bool, wait: bool, wait_timeout: float, as_json: bool
) -> None:
    """rebalance and drain: the proposals, shown (--dry-run) or asked of the manager as moves."""
    from dataclasses import asdict

    from fabric.cluster.etcd import EtcdClient
    from fabric.federation.move_requests import ask_moves, propose, set_draining, wait_move

    meta = EtcdClient(_urls(etcd_urls))
    try:
        now_ms = time.time_ns() // 1_000_000
        if drained is not None and not dry_run:
            set_draining(meta, drained, True)  # before proposing: no new queue lands there meanwhile
        proposals = propose(meta, now_ms, drained)
        if dry_run:
            doc: dict[str, Any] = {"moves": [asdict(p) for p in proposals]}
        else:
            asked = ask_moves(meta, proposals, now_ms)
            doc = {
                "moves": [{**asdict(p), "asked": why is None, "refused": why} for p, why in asked]
                + [{**asdict(p), "asked": False, "refused": None} for p in proposals if p.destination is None]
            }
        if as_json and not wait:
            click.echo(json.dumps(doc))
        elif not as_json:
            verb = "would move" if dry_run else "moving"
            for m in doc["moves"]:
                if m["destination"] is None:
                    click.echo(f"{m['queue']}: stays on {m['source']}: {m['why']}")
                elif m.get("refused"):
                    click.echo(f"{m['queue']}: not moved: {m['refused']}")
                else:
                    click.echo(
                        f"{verb} {m['queue']}: {m['source']} -> {m['destination']} (weight {m['weight']:.3f}; {m['why']})"
                    )
            if not doc["moves"]:
                click.echo("nothing to move" if drained is None else f"{drained} holds no queue")
        if wait and not dry_run:
            failed = []
            for m in doc["moves"]:
                if m.get("asked"):
                    final = wait_move(meta, m["queue"], wait_timeout)
                    m["phase"] = final.phase
                    if not as_json:
                        click.echo(f"move of {final.queue}: {final.source} -> {final.destination}: {final.phase}")
                    if final.phase != "done":
                        failed.append(final.queue)
            if as_json:
                click.echo(json.dumps(doc))
            if failed:
                sys.exit(1)
    finally:
        meta.close()


@federation.command("rebalance")
@click.option("--etcd", "etcd_urls", required=True, help="The federation's etcd client URLs, comma-separated.")
@click.option("--dry-run", is_flag=True, help="Show the moves that would even out the clusters; move nothing.")
@click.option("--wait", is_flag=True, help="Wait until every move asked for has finished.")
@click.option(
    "--wait-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True, help="Seconds per move."
)
@JSON
def federation_rebalance(etcd_urls: str, dry_run: bool, wait: bool, wait_timeout: float, as_json: bool) -> None:
    """Move whole queues from the most loaded clusters to the least loaded ones that take queues,
    until their loads are within 0.1 of each other (at most 10 moves; docs/federation.md,
    "Rebalance and drain"). Each move is a `fabric queue move`."""
    _carry_out(etcd_urls, None, dry_run, wait, wait_timeout, as_json)


@federation.command("drain")
@click.argument("cluster")
@click.option("--etcd", "etcd_urls", required=True, help="The federation's etcd client URLs, comma-separated.")
@click.option("--dry-run", is_flag=True, help="Show where each queue would go; change nothing.")
@click.option("--wait", is_flag=True, help="Wait until every move asked for has finished.")
@click.option(
    "--wait-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True, help="Seconds per move."
)
@click.option("--undo", is_flag=True, help="The cluster takes queues again (moves already made stay).")
@JSON
def federation_drain(
    cluster: str, etcd_urls: str, dry_run: bool, wait: bool, wait_timeout: float, undo: bool, as_json: bool
) -> None:
    """Empty CLUSTER before it is retired: it gets no new queue, and each of its queues moves to the
    least loaded cluster that takes queues (split queues stay: said why)."""
    if undo:
        from fabric.cluster.etcd import EtcdClient
        from fabric.federation.move_requests import set_draining

        meta = EtcdClient(_urls(etcd_urls))
        try:
            set_draining(meta, cluster, False)
        finally:
            meta.close()
        click.echo(f"{cluster} takes queues again")
        return
    _carry_out(etcd_urls, cluster, dry_run, wait, wait_timeout, as_json)


def _ready_line(proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any] | None:
    """The child's JSON ready line, or None if it exited or said nothing within ``timeout_s``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    buf = b""
    while time.monotonic() < deadline and b"\n" not in buf:
        ready, _, _ = select.select([proc.stdout], [], [], min(1.0, max(0.0, deadline - time.monotonic())))
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return None  # it exited
            buf += chunk
    if b"\n" not in buf:
        return None
    info: dict[str, Any] = json.loads(buf.split(b"\n", 1)[0])
    return info


def up_federation(
    config_path: str,
    clusters: list[tuple[Path, Any]],
    as_json: bool = False,
    ready_file: str | None = None,
    ready_timeout_s: float = 60.0,
) -> None:
    """`fabric up --config FEDERATION.toml`: one `fabric up --config CLUSTER.toml` child per
    cluster, in order (the first usually starts the etcd members the others use), each started
    once the one before is ready; ready once all are. SIGINT or SIGTERM stops them in reverse
    order (SIGTERM, each supervisor stops its own processes), and so does a child that exits."""
    from fabric import __version__
    from fabric.cli.ready import announce_ready

    children: list[subprocess.Popen[bytes]] = []
    stop = {"why": ""}

    def on_term(signum: int, frame: Any) -> None:
        stop["why"] = "stopped"

    previous = signal.signal(signal.SIGTERM, on_term)
    started = time.monotonic()
    try:
        infos = []
        for path, config in clusters:
            argv = [sys.executable, "-m", "fabric.cli", "up", "--config", str(path), "--json"]
            argv += ["--ready-timeout", str(ready_timeout_s)]
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
            children.append(proc)
            info = _ready_line(proc, ready_timeout_s + 15)
            if info is None:
                raise click.ClickException(f"cluster {config.cluster.name} ({path}) did not become ready")
            infos.append(info)
        info = {
            "event": "ready",
            "version": __version__,
            "federation": True,
            "clusters": infos,
            "pid": os.getpid(),
            "ready_ms": int((time.monotonic() - started) * 1000),
        }
        announce_ready(info, as_json, ready_file)
        if not as_json:
            for c in infos:
                routers = ",".join(r["endpoint"] for r in c["routers"])
                click.echo(f"cluster {c['name']} up: {len(c['nodes'])} stores, routers {routers or '(none)'}")
            click.echo(f"status: fabric federation status --config {clusters[0][0]}    Ctrl-C stops everything.")
            sys.stdout.flush()
        while not stop["why"]:
            for proc, (path, _) in zip(children, clusters, strict=True):
                if proc.poll() is not None:
                    stop["why"] = f"the supervisor of {path} exited ({proc.returncode})"
            time.sleep(0.2)
        if stop["why"] != "stopped":
            click.echo(f"error: {stop['why']}; stopping the others", err=True)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        for proc in reversed(children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if ready_file:
            Path(ready_file).unlink(missing_ok=True)
    if not as_json:
        click.echo("fabric federation stopped.")
    if stop["why"] not in ("", "stopped"):
        sys.exit(1)
