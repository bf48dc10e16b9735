"""`fabric group ...` and `fabric dlq ...`: consumer groups and dead-letter queues."""

from __future__ import annotations

import json
import time

import click

from fabric.cli_common import ENDPOINT, JSON, _emit, _Group, _table

# ---------------------------------------------------------------------- groups and dead letters


@click.group(cls=_Group)
def group() -> None:
    """Consumer groups: list, describe, reset offsets."""


@group.command("list")
@click.argument("queue_name", metavar="QUEUE")
@ENDPOINT
@JSON
def group_list(queue_name: str, endpoint: str, as_json: bool) -> None:
    """List the consumer groups of QUEUE with their kind, members and lag or backlog."""
    from fabric.client import Admin

    with Admin(endpoint) as admin:
        groups = admin.groups(queue_name)
    rows = [
        {
            "group": name,
            "kind": g.get("kind", "stream"),
            "members": len(g["members"]) if isinstance(g.get("members"), dict) else g.get("members", 0),
            "lag": g.get("total_lag", ""),
            "backlog": g.get("backlog", ""),
            "in_flight": g.get("in_flight", ""),
        }
        for name, g in sorted(groups.items())
    ]
    _emit(rows, as_json, lambda r: _table(r, ["group", "kind", "members", "lag", "backlog", "in_flight"]))


@group.command("describe")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@ENDPOINT
@JSON
def group_describe(queue_name: str, group_name: str, endpoint: str, as_json: bool) -> None:
    """Show a group: committed offsets and lag per partition, members and what they own."""
    from fabric.client import Admin

    with Admin(endpoint) as admin:
        g = admin.describe_group(queue_name, group_name)
    _emit(g, as_json, lambda g: json.dumps(g, indent=2, sort_keys=True))


@group.command("reset-offsets")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@click.option("--to", "to", required=True, help="earliest, latest, an offset, or ts:<epoch ms>.")
@click.option("--partition", "partitions", type=int, multiple=True, help="Only these partitions.")
@click.option("--execute", is_flag=True, help="Really commit (the default is a dry run).")
@ENDPOINT
@JSON
def group_reset(
    queue_name: str, group_name: str, to: str, partitions: tuple[int, ...], execute: bool, endpoint: str, as_json: bool
) -> None:
    """Move a stream group's committed offsets. A dry run unless --execute; the group must have no live members."""
    from fabric.client import Admin

    target: str | int = int(to) if to.isdigit() else to
    if not (isinstance(target, int) or target in ("earliest", "latest") or str(target).startswith("ts:")):
        raise click.BadParameter("use earliest, latest, an offset or ts:<epoch ms>", param_hint="--to")
    with Admin(endpoint) as admin:
        new = admin.reset_offsets(queue_name, group_name, target, partitions=list(partitions) or None, execute=execute)
    rows = [{"partition": p, "offset": o} for p, o in sorted(new.items())]
    _emit(
        {"executed": execute, "offsets": {str(p): o for p, o in new.items()}},
        as_json,
        lambda _: (
            _table(rows, ["partition", "offset"])
            + ("\ncommitted." if execute else "\ndry run: add --execute to commit.")
        ),
    )


@click.group(cls=_Group)
def dlq() -> None:
    """Dead-letter queues: list, peek (browse without consuming), redrive."""


@dlq.command("list")
@ENDPOINT
@JSON
def dlq_list(endpoint: str, as_json: bool) -> None:
    """List dead-letter queues (<queue>.dlq and queues named as a dead_letter_queue)."""
    from fabric.client import Admin

    with Admin(endpoint) as admin:
        queues = admin.list_queues()
        named = set()
        for q in queues:
            target = admin.describe_queue(q["name"])["settings"].get("dead_letter_queue")
            if target:
                named.add(target)
    rows = [q for q in queues if q["name"].endswith(".dlq") or q["name"] in named]
    _emit(rows, as_json, lambda r: _table(r, ["name", "messages", "size_bytes"]))


@dlq.command("peek")
@click.argument("dlq_name", metavar="DLQ")
@click.option("--count", "-n", type=int, default=10, show_default=True)
@ENDPOINT
@JSON
def dlq_peek(dlq_name: str, count: int, endpoint: str, as_json: bool) -> None:
    """Show dead letters with their history (source, reason, receive count) without consuming them."""
    from fabric.client import Consumer

    with Consumer(dlq_name, endpoint, start="earliest") as c:
        shown = 0
        deadline = time.monotonic() + 3
        while shown < count and time.monotonic() < deadline:
            for m in c.poll(300):
                if shown >= count:
                    break
                shown += 1
                h = {k: v.decode(errors="replace") for k, v in (m.headers or {}).items()}
                rec = {"offset": m.offset, "value": m.value.decode(errors="replace"), "headers": h}
                if as_json:
                    click.echo(json.dumps(rec))
                else:
                    click.echo(
                        f"{m.offset}: {rec['value']!r} from {h.get('x-dlq-source')}/{h.get('x-dlq-partition')}"
                        f"@{h.get('x-dlq-offset')} reason {h.get('x-dlq-reason')} after {h.get('x-dlq-receive-count')} deliveries"
                    )


@dlq.command("redrive")
@click.argument("dlq_name", metavar="DLQ")
@click.option("--reason", help="Only dead letters with this reason.")
@click.option("--max", "max_messages", type=int, default=1_000_000, show_default=True)
@click.option("--dry-run", is_flag=True, help="Count what would move, move nothing.")
@ENDPOINT
@JSON
def dlq_redrive(
    dlq_name: str, reason: str | None, max_messages: int, dry_run: bool, endpoint: str, as_json: bool
) -> None:
    """Move dead letters back to the queues they came from (each at most once)."""
    from fabric.client import Admin

    with Admin(endpoint) as admin:
        r = admin.redrive(dlq_name, max_messages=max_messages, reason=reason, dry_run=dry_run)
    _emit(
        r,
        as_json,
        lambda r: f"{'would move' if dry_run else 'moved'} {r['matching']} message(s); {r['skipped']} skipped",
    )
