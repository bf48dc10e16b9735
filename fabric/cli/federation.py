"""`fabric federation status`: the clusters sharing one etcd, as the federation directory holds them."""

from __future__ import annotations

import json
import time
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
        if c["problems"]:
            lines.append(f"{c['name']}: takes no new queue: {'; '.join(c['problems'])}")
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
