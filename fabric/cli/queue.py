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
    """Create, list, describe, alter, purge and delete queues."""


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
    _emit(d, as_json, _created)


def _created(d: dict[str, Any]) -> str:
    """queue create's line: what the queue is. A direct queue stores nothing (no fsync to name);
    with priority levels, each level of a partition is a log partition of its own, and sends and
    receives name those (level l of partition p is l * partitions + p)."""
    settings = d.get("settings") or {}
    parts = d["partitions"]
    if settings.get("mode") == "direct":
        return (
            f"queue {d['name']} ready: direct (brokerless: producers send straight to consumers, "
            f"nothing stored, at most once), {parts} partition(s)"
        )
    levels = int(settings.get("priority_levels") or d.get("priority_levels") or 1)
    shape = f"{parts} partition(s)"
    if levels > 1:
        shape += f" x {levels} priority levels = log partitions 0..{parts * levels - 1} (level l of p is l*{parts}+p)"
    return f"queue {d['name']} ready: {shape}, fsync {settings.get('fsync')}"


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
        live = d.get("live_partitions", d["partitions"])
        if live < d["partitions"]:
            head += (
                f", shrinking to {live} partitions (partitions {live}..{d['partitions'] - 1} take no writes "
                "and go once every group has consumed them)"
            )
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
    help="Grow to this many partitions (only ever added; keyed messages then hash over the new count).",
)
@click.option(
    "--set",
    "changes",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change a setting on the live queue (repeatable): retention_ms, retention_bytes, max_messages, "
    "max_bytes, max_message_bytes, overflow, visibility_timeout_ms, max_receive_count, dead_letter_queue, "
    "default_ttl_ms, on_expire, dedup_window_ms, fsync, segment_bytes, auto_partitions_max, ... "
    "Those fixed at create (partitions: use --partitions; priority_levels, encrypt, mode, ordering, "
    "replication_factor) are refused with the reason. A cluster's stores apply them within moments.",
)
@ENDPOINT
@JSON
def queue_alter(name: str, partitions: int | None, changes: tuple[str, ...], endpoint: str, as_json: bool) -> None:
    """Change queue NAME: add partitions (--partitions N), or settings that may change live
    (--set KEY=VALUE ...; they take effect at once, as `kafka-configs --alter` and `aws sqs
    set-queue-attributes`). Added partitions: existing ones keep their data and numbers; a key whose
    partition changes (crc32c(key) % partitions) is read in order only from the change on."""

    if partitions is None and not changes:
        raise click.UsageError("say what to change: --partitions N and/or --set KEY=VALUE")
    settings: dict[str, Any] = {}
    for item in changes:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--set")
        settings[key.strip()] = _parse_value(value.strip())
    out: dict[str, Any] = {"name": name}
    with _admin(endpoint) as admin:
        if partitions is not None:
            grown = admin.alter_queue(name, partitions=partitions)
            out.update(partitions=grown["partitions"], added=grown["added"])
        if settings:
            altered = admin.alter_queue(name, settings=settings)
            out.update(settings=altered["settings"], changed=altered["changed"])

    def human(d: dict[str, Any]) -> str:
        lines = []
        if "partitions" in d:
            lines.append(
                f"queue {d['name']}: {d['partitions']} partition(s)"
                + (f" ({d['added']} added)" if d["added"] else " (unchanged)")
            )
        if "changed" in d:
            if not d["changed"]:
                lines.append(f"queue {d['name']}: settings unchanged (already so)")
            lines += [f"queue {d['name']}: {k} {old} -> {new}" for k, (old, new) in d["changed"].items()]
        return "\n".join(lines)

    _emit(out, as_json, human)


@queue.command("purge")
@click.argument("name")
@YES
@ENDPOINT
@JSON
def queue_purge(name: str, yes: bool, endpoint: str, as_json: bool) -> None:
    """Remove every message of queue NAME, keeping the queue, its settings and its consumer groups
    (which then have nothing left), as SQS, NATS and RabbitMQ purge. Asks first; without a
    terminal, needs --yes. Messages not yet visible when it runs (still being written, delayed
    ones not yet due) stay."""

    confirm(f"Remove every message of queue {name}?", yes)
    with _admin(endpoint) as admin:
        d = admin.purge_queue(name)
    _emit(d, as_json, lambda d: f"queue {name} purged: {d['purged']} message(s) removed")


@queue.command("delete")
@click.argument("name")
@YES
@click.option("--if-exists", is_flag=True, help="Succeed if the queue does not exist.")
@click.option(
    "--etcd",
    "etcd_urls",
    help="A federation queue: ask the federation manager (its etcd client URLs, comma-separated); "
    "every cluster holding a share deletes it.",
)
@click.option(
    "--wait-timeout",
    "wait_timeout_s",
    type=click.FloatRange(min=0.1),
    default=30,
    show_default=True,
    help="With --etcd: seconds to wait until no cluster holds the queue.",
)
@ENDPOINT
@JSON
def queue_delete(
    name: str, yes: bool, if_exists: bool, etcd_urls: str | None, wait_timeout_s: float, endpoint: str, as_json: bool
) -> None:
    """Delete queue NAME and all its data (asks first; without a terminal, needs --yes). With
    --etcd, a federation queue on every cluster holding it (docs/federation.md)."""

    confirm(f"Delete queue {name} and all its messages?", yes)
    if etcd_urls:
        from fabric.errors import UnknownQueue
        from fabric.federation.status import delete_queue

        urls = [u.strip() for u in etcd_urls.split(",") if u.strip()]
        try:
            d = delete_queue(urls, name, wait_timeout_s)
        except UnknownQueue:
            if not if_exists:
                raise
            d = {"queue": name, "deleted": False}
        _emit(
            d,
            as_json,
            lambda d: (
                f"queue {name} deleted on {', '.join(d['clusters'])}" if d["deleted"] else f"queue {name} did not exist"
            ),
        )
        return
    with _admin(endpoint) as admin:
        deleted = admin.delete_queue(name, if_exists=if_exists)
    _emit(
        {"queue": name, "deleted": bool(deleted)},
        as_json,
        lambda d: f"queue {name} deleted" if d["deleted"] else f"queue {name} did not exist",
    )


@queue.command("move")
@click.argument("name")
@click.option("--to", "destination", metavar="CLUSTER", help="The federation cluster to move the queue to.")
@click.option("--etcd", "etcd_urls", required=True, help="The federation's etcd client URLs, comma-separated.")
@click.option(
    "--dry-run", is_flag=True, help="Say what the move would do (or why it would be refused); change nothing."
)
@click.option("--wait", "wait", is_flag=True, help="Wait until the move has finished, printing each phase.")
@click.option("--cancel", is_flag=True, help="Roll back the queue's move under way (before it has switched).")
@click.option("--wait-timeout", type=click.FloatRange(min=0), default=300.0, show_default=True, help="Seconds.")
@JSON
def queue_move(
    name: str,
    destination: str | None,
    etcd_urls: str,
    dry_run: bool,
    wait: bool,
    cancel: bool,
    wait_timeout: float,
    as_json: bool,
) -> None:
    """Move queue NAME to another cluster of the federation: its log copied while it serves, a
    short fenced cut-over, its groups' offsets carried, the directory switched, the old copy
    deleted (docs/federation.md, "Moving a queue"). Exit 1 if the move was refused or rolled back."""
    import sys
    import time
    from dataclasses import asdict

    from fabric.cluster.etcd import EtcdClient
    from fabric.federation.move_requests import cancel_move, plan_move, request_move, wait_move
    from fabric.federation.moves import DONE, Move

    if not cancel and not destination:
        raise click.UsageError("give --to CLUSTER (or --cancel)")
    meta = EtcdClient([u.strip() for u in etcd_urls.split(",") if u.strip()])

    def line(m: Move) -> str:
        extra = f": {m.error}" if m.error else ""
        return f"move of {m.queue}: {m.source} -> {m.destination}: {m.phase}{extra}"

    try:
        now_ms = int(time.time() * 1000)
        if dry_run:
            plan = plan_move(meta, name, destination or "", now_ms)
            _emit(
                plan,
                as_json,
                lambda d: (
                    f"would move {name}: {d['partitions']} partition(s) {d['source']} -> {d['destination']}, "
                    f"groups carried: {', '.join(d['groups']) or 'none'}"
                    if d["problem"] is None
                    else f"would refuse: {d['problem']}"
                ),
            )
            if plan["problem"] is not None:
                sys.exit(1)
            return
        move = cancel_move(meta, name) if cancel else request_move(meta, name, destination or "", now_ms)
        if not wait:
            _emit(asdict(move), as_json, lambda d: line(move) + (" (cancel asked)" if cancel else ""))
            return
        final = wait_move(meta, name, wait_timeout, None if as_json else lambda m: click.echo(line(m)))
        if as_json:
            _emit(asdict(final), True, str)
        if final.phase != DONE:
            sys.exit(1)
    finally:
        meta.close()
