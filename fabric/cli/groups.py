"""`fabric group ...` and `fabric dlq ...`: consumer groups and dead-letter queues."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from fabric.cli.common import ENDPOINT, JSON, YES, _admin, _emit, _Group, _table, confirm
from fabric.errors import FabricError, UnknownQueue

# ---------------------------------------------------------------------- groups and dead letters


@click.group(cls=_Group)
def group() -> None:
    """Consumer groups: list, describe, reset offsets, delete."""


def _chosen_queues(admin: Any, queue_name: str | None, all_queues: bool) -> list[str]:
    """QUEUE, or with --all-queues every queue but the node's internal ones (a usage error: both, neither)."""
    if (queue_name is None) == (not all_queues):
        raise click.UsageError("name a QUEUE or give --all-queues (not both)")
    if queue_name is not None:
        return [queue_name]
    return [q["name"] for q in admin.list_queues() if not q["name"].startswith("__")]


def _each_queue(admin: Any, names: list[str], one: bool) -> Any:
    """``(name, description)`` of each queue; with many, one deleted meanwhile is skipped."""
    for name in names:
        try:
            yield name, admin.describe_queue(name)
        except UnknownQueue:
            if one:
                raise


ALL_QUEUES = click.option(
    "--all-queues", "all_queues", is_flag=True, help="Every queue's groups (as kafka-consumer-groups --all-groups)."
)


@group.command("list")
@click.argument("queue_name", metavar="[QUEUE]", required=False)
@ALL_QUEUES
@ENDPOINT
@JSON
def group_list(queue_name: str | None, all_queues: bool, endpoint: str, as_json: bool) -> None:
    """List the consumer groups of QUEUE (or of every queue, --all-queues) with their kind, members
    and lag or backlog."""

    with _admin(endpoint) as admin:
        names = _chosen_queues(admin, queue_name, all_queues)
        described = list(_each_queue(admin, names, queue_name is not None))
    rows = [
        {
            **({"queue": qname} if all_queues else {}),
            "group": name,
            "kind": g.get("kind", "stream"),
            "members": len(g["members"]) if isinstance(g.get("members"), dict) else g.get("members", 0),
            "lag": g.get("total_lag", ""),
            "backlog": g.get("backlog", ""),
            "in_flight": g.get("in_flight", ""),
        }
        for qname, d in described
        for name, g in sorted(d["groups"].items())
    ]
    columns = ["group", "kind", "members", "lag", "backlog", "in_flight"]
    _emit(rows, as_json, lambda r: _table(r, (["queue"] if all_queues else []) + columns))


@click.command()
@click.argument("queue_name", metavar="[QUEUE]", required=False)
@ALL_QUEUES
@click.option("--group", "-g", "group_name", help="Only this group.")
@ENDPOINT
@JSON
def lag(queue_name: str | None, all_queues: bool, group_name: str | None, endpoint: str, as_json: bool) -> None:
    """Per group and partition: committed offset (a queue group: its oldest unsettled), high
    watermark and lag, of QUEUE or of every queue (--all-queues), as `kafka-consumer-groups
    --describe`. One row per group and partition; --json: a list of those rows."""

    with _admin(endpoint) as admin:
        names = _chosen_queues(admin, queue_name, all_queues)
        described = list(_each_queue(admin, names, queue_name is not None))
    rows = []
    for qname, d in described:
        hw = {str(x["partition"]): x["high_watermark"] for x in d["partition_detail"]}
        for gname, g in sorted(d["groups"].items()):
            if group_name is not None and gname != group_name:
                continue
            kind = g.get("kind", "stream")
            position = (g.get("floors") if kind != "stream" else None) or g.get("committed", {})
            for p in sorted(hw, key=int):
                rows.append(
                    {
                        "queue": qname,
                        "group": gname,
                        "kind": kind,
                        "partition": int(p),
                        "committed": position.get(p),
                        "high_watermark": hw[p],
                        "lag": g.get("lag", {}).get(p, ""),
                        "members": len(g["members"]) if isinstance(g.get("members"), dict) else g.get("members", 0),
                    }
                )
    cols = ["queue", "group", "kind", "partition", "committed", "high_watermark", "lag", "members"]
    _emit(rows, as_json, lambda r: _table(r, cols))


@group.command("describe")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@ENDPOINT
@JSON
def group_describe(queue_name: str, group_name: str, endpoint: str, as_json: bool) -> None:
    """Show a group: committed offsets and lag per partition, members and what they own."""

    with _admin(endpoint) as admin:
        g = admin.describe_group(queue_name, group_name)
    _emit(g, as_json, lambda g: _describe_human(queue_name, group_name, g))


def _describe_human(queue_name: str, group_name: str, g: dict[str, Any]) -> str:
    """A head line, then a table per partition (and per member for a stream group), as `group list`."""
    kind = g.get("kind", "stream")
    members = g.get("members", {})
    head = f"group {group_name} on {queue_name}: {kind}, {len(members) if isinstance(members, dict) else members} member(s)"
    head += f", lag {g.get('total_lag', 0)} message(s), {g.get('lag_seconds', 0)} s"
    if kind != "stream":
        head += f"; backlog {g.get('backlog', 0)}, in flight {g.get('in_flight', 0)}"
        head += f", redeliverable {g.get('redeliverable', 0)}"
    elif "generation" in g:
        head += f"; generation {g['generation']}"
    owner = {
        str(p): member
        for member, info in (members.items() if isinstance(members, dict) else [])
        for p in info.get("owned", [])
    }
    unsettled = g.get("oldest_unsettled", {})
    rows = [
        {
            "partition": p,
            "committed": offset,
            "lag": g.get("lag", {}).get(p, ""),
            **({"owner": owner.get(p)} if kind == "stream" else {"oldest_unsettled": unsettled.get(p)}),
        }
        for p, offset in sorted(g.get("committed", {}).items(), key=lambda item: int(item[0]))
    ]
    parts = [head, _table(rows, list(rows[0]) if rows else ["partition"])]
    if kind == "stream" and isinstance(members, dict) and members:
        shown = [
            {
                "member": m,
                "owns": ",".join(map(str, info.get("owned", []))) or "-",
                "revoking": ",".join(map(str, info.get("revoking", []))) or "-",
            }
            for m, info in sorted(members.items())
        ]
        parts.append(_table(shown, ["member", "owns", "revoking"]))
    return "\n\n".join(parts)


@group.command("reset-offsets")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@click.option("--to", "to", required=True, help="earliest, latest, an offset, or ts:<epoch ms>.")
@click.option("--partition", "partitions", type=click.IntRange(0, 65535), multiple=True, help="Only these partitions.")
@click.option("--execute", is_flag=True, help="Really commit (the default is a dry run).")
@YES
@ENDPOINT
@JSON
def group_reset(
    queue_name: str,
    group_name: str,
    to: str,
    partitions: tuple[int, ...],
    execute: bool,
    yes: bool,
    endpoint: str,
    as_json: bool,
) -> None:
    """Move a stream group's committed offsets. A dry run unless --execute (which asks first; without
    a terminal it needs --yes); the group must have no live members."""

    target: str | int = int(to) if to.isdigit() else to
    if not (isinstance(target, int) or target in ("earliest", "latest") or str(target).startswith("ts:")):
        raise click.BadParameter("use earliest, latest, an offset or ts:<epoch ms>", param_hint="--to")
    if execute:
        confirm(f"Move the committed offsets of group {group_name} on {queue_name} to {to}?", yes)
    with _admin(endpoint) as admin:
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


@group.command("delete")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group_name", metavar="GROUP")
@YES
@ENDPOINT
@JSON
def group_delete(queue_name: str, group_name: str, yes: bool, endpoint: str, as_json: bool) -> None:
    """Delete consumer group GROUP of QUEUE: its committed offsets, a queue group's leases and its
    entry in `group list` (asks first; without a terminal, needs --yes). Refused while the group has
    live members (stop them first), or when QUEUE has no such group."""

    confirm(f"Delete group {group_name} of queue {queue_name} and its committed offsets?", yes)
    with _admin(endpoint) as admin:
        admin.delete_group(queue_name, group_name)
    _emit(
        {"queue": queue_name, "group": group_name, "deleted": True},
        as_json,
        lambda d: f"group {group_name} of queue {queue_name} deleted",
    )


DLQ_REASONS = ("max_receive_count", "expired", "overflow")


@click.group(cls=_Group)
def dlq() -> None:
    """Dead-letter queues: list, peek (browse without consuming), redrive."""


@dlq.command("list")
@ENDPOINT
@JSON
def dlq_list(endpoint: str, as_json: bool) -> None:
    """List dead-letter queues (<queue>.dlq and queues named as a dead_letter_queue)."""

    with _admin(endpoint) as admin:
        queues = admin.list_queues()
        for q in queues:
            if q.get("messages") is None:  # a cluster node that holds no replica of it: ask its own
                try:
                    q["dead_letter_queue"] = admin.describe_queue(q["name"])["settings"].get("dead_letter_queue")
                except FabricError:
                    pass  # deleted meanwhile
    # a list entry names its queue's dead_letter_queue when the queue sets one
    named = {q["dead_letter_queue"] for q in queues if q.get("dead_letter_queue")}
    rows = [q for q in queues if q["name"].endswith(".dlq") or q["name"] in named]
    _emit(rows, as_json, lambda r: _table(r, ["name", "messages", "size_bytes"]))


@dlq.command("peek")
@click.argument("dlq_name", metavar="DLQ")
@click.option("--count", "-n", type=click.IntRange(min=1), default=10, show_default=True)
@ENDPOINT
@JSON
def dlq_peek(dlq_name: str, count: int, endpoint: str, as_json: bool) -> None:
    """Show dead letters with their history (source, reason, receive count) without consuming them.
    Returns as soon as it has shown what the DLQ holds (or --count of them)."""
    from fabric.client import Consumer

    with _admin(endpoint) as admin:
        detail = admin.describe_queue(dlq_name)["partition_detail"]
    ends = {d["partition"]: d["high_watermark"] for d in detail if d["high_watermark"] > d["log_start_offset"]}
    with Consumer(dlq_name, endpoint, start="earliest", partitions=sorted(ends) or None) as c:
        shown = 0
        deadline = time.monotonic() + 10  # bounded, should the node stop pushing
        while ends and shown < count and time.monotonic() < deadline:
            for m in c.poll(300):
                if m.offset + 1 >= ends.get(m.partition, 0):
                    ends.pop(m.partition, None)  # this partition is all shown
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
@click.option(
    "--reason",
    type=click.Choice(DLQ_REASONS),
    help="Only dead letters with this reason (their x-dlq-reason header).",
)
@click.option("--max", "max_messages", type=click.IntRange(1, 100_000_000), default=1_000_000, show_default=True)
@click.option("--dry-run", is_flag=True, help="Count what would move, move nothing.")
@YES
@ENDPOINT
@JSON
def dlq_redrive(
    dlq_name: str, reason: str | None, max_messages: int, dry_run: bool, yes: bool, endpoint: str, as_json: bool
) -> None:
    """Move dead letters back to the queues they came from (each at most once). Asks first unless
    --dry-run; without a terminal it needs --yes. The request it sends is REDRIVE
    {"queue": DLQ, "max_messages": N, "reason": REASON or null, "dry_run": bool} (docs/protocol.md);
    the answer, with --json: {"matching": n, "skipped": n, ...}."""

    if not dry_run:
        what = f"dead letters with reason {reason}" if reason else "every dead letter"
        confirm(f"Move {what} of {dlq_name} (at most {max_messages}) back to their queues?", yes)

    with _admin(endpoint) as admin:
        r = admin.redrive(dlq_name, max_messages=max_messages, reason=reason, dry_run=dry_run)
    _emit(
        r,
        as_json,
        lambda r: f"{'would move' if dry_run else 'moved'} {r['matching']} message(s); {r['skipped']} skipped",
    )
