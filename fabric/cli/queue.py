"""`fabric queue`: create, list, describe, alter and delete queues."""

from __future__ import annotations

from typing import Any

import click

from fabric.cli.common import DURATION, ENDPOINT, JSON, YES, _admin, _emit, _Group, _table, confirm


def _parse_value(raw: str) -> Any:
    for cast in (int,):
        try:
            return cast(raw)
        except ValueError:
            pass
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw


@click.group(cls=_Group)
def queue() -> None:
    """Create, list, describe and delete queues."""


@queue.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=click.IntRange(1, 4096), help="Number of partitions (default 1).")
@click.option("--fsync", type=click.Choice(["always", "interval", "never"]), help="Fsync policy (default always).")
@click.option("--retention-ms", type=click.IntRange(min=0), help="Delete segments older than this (0 = keep).")
@click.option("--max-message-bytes", type=click.IntRange(min=1), help="Largest message accepted.")
@click.option("--max-messages", type=click.IntRange(min=0), help="Queue size limit in messages (0 = none).")
@click.option("--max-bytes", type=click.IntRange(min=0), help="Queue size limit in bytes (0 = none).")
@click.option(
    "--overflow", type=click.Choice(["reject", "dead_letter_oldest"]), help="At max-messages (default reject)."
)
@click.option("--ordering", type=click.Choice(["fifo", "strict"]), help="strict: by the producers' clocks.")
@click.option("--ordering-window", "ordering_window_ms", type=DURATION, help="strict: how long to wait for stragglers.")
@click.option("--priority-levels", type=click.IntRange(1, 10), help="Priority levels 0..N-1 (default 1: none).")
@click.option("--default-ttl", "default_ttl_ms", type=DURATION, help="Queue subscriptions expire messages after this.")
@click.option("--on-expire", type=click.Choice(["dead_letter", "drop"]), help="What expiry does (default dead_letter).")
@click.option("--dedup-window", "dedup_window_ms", type=DURATION, help="Drop messages whose dedup id was seen within.")
@click.option(
    "--max-receive-count", type=click.IntRange(min=0), help="Deliveries before a message is dead-lettered (0 = never)."
)
@click.option("--visibility-timeout", "visibility_timeout_ms", type=DURATION, help="Lease length of a delivery.")
@click.option("--set", "extra", multiple=True, metavar="KEY=VALUE", help="Any other queue setting.")
@click.option("--if-not-exists", is_flag=True, help="Succeed if the queue already exists.")
@click.option(
    "--clusters",
    type=click.IntRange(1, 64),
    help="Ask the federation manager (docs/federation.md) to place the queue on the N healthy clusters "
    "with the most room, its partitions spread over them; needs --etcd.",
)
@click.option("--etcd", "etcd_urls", help="With --clusters: the federation's etcd client URLs, comma-separated.")
@click.option(
    "--wait-timeout",
    "wait_timeout_s",
    type=click.FloatRange(min=0.1),
    default=30,
    show_default=True,
    help="With --clusters: seconds to wait until every chosen cluster holds the queue.",
)
@ENDPOINT
@JSON
def queue_create(
    name: str,
    extra: tuple[str, ...],
    if_not_exists: bool,
    clusters: int | None,
    etcd_urls: str | None,
    wait_timeout_s: float,
    endpoint: str,
    as_json: bool,
    **opts: Any,
) -> None:
    """Create queue NAME (with --clusters, through the federation manager)."""

    settings = {k: v for k, v in opts.items() if v is not None}
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--set")
        settings[key.strip()] = _parse_value(value.strip())
    if clusters is not None:
        _create_in_federation(name, settings, clusters, etcd_urls, wait_timeout_s, if_not_exists, as_json)
        return
    with _admin(endpoint) as admin:
        d = admin.create_queue(name, if_not_exists=if_not_exists, **settings)
    _emit(
        d, as_json, lambda d: f"queue {d['name']} ready: {d['partitions']} partition(s), fsync {d['settings']['fsync']}"
    )


def _create_in_federation(
    name: str,
    settings: dict[str, Any],
    clusters: int,
    etcd_urls: str | None,
    wait_timeout_s: float,
    if_not_exists: bool,
    as_json: bool,
) -> None:
    from fabric.errors import QueueExists
    from fabric.federation.status import request_queue

    if not etcd_urls:
        raise click.UsageError("--clusters needs --etcd URL[,URL...] (the federation's etcd)")
    urls = [u.strip() for u in etcd_urls.split(",") if u.strip()]
    try:
        d = request_queue(urls, name, settings, clusters, wait_timeout_s)
    except QueueExists:
        if not if_not_exists:
            raise
        d = {"name": name, "exists": True}
    _emit(
        d,
        as_json,
        lambda d: (
            f"queue {name} exists"
            if d.get("exists")
            else f"queue {name} ready: {d['partitions']} partition(s) on {', '.join(d['clusters'])} "
            f"(partition -> cluster: {' '.join(d['placement'])})"
        ),
    )


@queue.command("list")
@click.option("--prefix", help="Only queues whose names start with this.")
@click.option("--all", "show_all", is_flag=True, help="Also the node's internal queues (names starting __).")
@ENDPOINT
@JSON
def queue_list(prefix: str | None, show_all: bool, endpoint: str, as_json: bool) -> None:
    """List queues with their sizes (every one: the node is asked page by page); internal
    queues (__usage, ...) only with --all."""

    with _admin(endpoint) as admin:
        rows = admin.list_queues(prefix)
    if not show_all and not (prefix or "").startswith("__"):  # --prefix __ asks for them
        rows = [r for r in rows if not r["name"].startswith("__")]
    _emit(rows, as_json, lambda r: _table(r, ["name", "partitions", "messages", "size_bytes"]))


@queue.command("describe")
@click.argument("name")
@ENDPOINT
@JSON
def queue_describe(name: str, endpoint: str, as_json: bool) -> None:
    """Show a queue's settings, partitions, offsets, groups and lag."""

    with _admin(endpoint) as admin:
        d = admin.describe_queue(name)

    def human(d: dict[str, Any]) -> str:
        head = f"queue {d['name']}: {d['messages']} messages, {d['size_bytes']} bytes on disk"
        if d.get("encrypted"):
            head += " (encrypted at rest)"
        if d.get("delayed", {}).get("batches"):
            head += f", {d['delayed']['batches']} delayed batch(es)"
        if d.get("priority_levels", 1) > 1:
            head += f", priority levels 0..{d['priority_levels'] - 1} (partition log = level * {d['partitions']} + p)"
        out = [head]
        cols = ["partition", "log_start_offset", "high_watermark", "messages", "size_bytes", "segments"]
        out.append(_table(d["partition_detail"], cols))
        out += [
            f"partition {x['partition']} NOT SERVED: {x['refused']}" for x in d["partition_detail"] if x.get("refused")
        ]
        for g, info in d["groups"].items():
            line = f"group {g}: total lag {info['total_lag']} ({info.get('lag_seconds', 0)} s)"
            if info.get("kind") == "queue":
                line += f", in flight {info['in_flight']}, redeliverable {info['redeliverable']}"
            out.append(line + f", committed {info['committed']}")
        dl = d.get("dead_letters")
        if dl:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(dl["reasons"].items())) or "none"
            out.append(f"dead letters: {dl['messages']} in {dl['queue']} (reasons: {reasons})")
        out.append(f"subscriptions: {len(d['subscriptions'])}")
        out.append("settings: " + ", ".join(f"{k}={v}" for k, v in d["settings"].items()))
        return "\n".join(out)

    _emit(d, as_json, human)


@queue.command("alter")
@click.argument("name")
@click.option(
    "--partitions",
    "-p",
    type=click.IntRange(1, 4096),
    required=True,
    help="Grow to this many partitions (only ever added; keyed messages then hash over the new count).",
)
@ENDPOINT
@JSON
def queue_alter(name: str, partitions: int, endpoint: str, as_json: bool) -> None:
    """Add partitions to queue NAME. Existing partitions keep their data and numbers; a key whose
    partition changes (crc32c(key) % partitions) is read in order only from the change on."""

    with _admin(endpoint) as admin:
        d = admin.alter_queue(name, partitions=partitions)
    _emit(
        d,
        as_json,
        lambda d: (
            f"queue {d['name']}: {d['partitions']} partition(s)"
            + (f" ({d['added']} added)" if d["added"] else " (unchanged)")
        ),
    )


@queue.command("delete")
@click.argument("name")
@YES
@click.option("--if-exists", is_flag=True, help="Succeed if the queue does not exist.")
@ENDPOINT
@JSON
def queue_delete(name: str, yes: bool, if_exists: bool, endpoint: str, as_json: bool) -> None:
    """Delete queue NAME and all its data (asks first; without a terminal, needs --yes)."""

    confirm(f"Delete queue {name} and all its messages?", yes)
    with _admin(endpoint) as admin:
        deleted = admin.delete_queue(name, if_exists=if_exists)
    _emit(
        {"queue": name, "deleted": bool(deleted)},
        as_json,
        lambda d: f"queue {name} deleted" if d["deleted"] else f"queue {name} did not exist",
    )
