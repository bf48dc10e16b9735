"""What DESCRIBE_QUEUE (and LIST_QUEUES, the CLI's describe and group commands) report."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fabric.errors import FabricError
from fabric.protocol.batch import HEADER_SIZE, decode_records, parse_header

if TYPE_CHECKING:
    from fabric.node.broker import Broker

LIST_PAGE_BYTES = 512 * 1024  # LIST_QUEUES: a page's params stay well under the 1 MiB frame ceiling
LIST_ENTRY_BYTES = 100  # a queue's entry there, not counting its name (at most about 95 bytes encoded)


def describe_queue(
    broker: Broker,
    name: str,
    *,
    dead_letters: bool = True,
    brief: bool = False,
    group_names: list[str] | None = None,
) -> dict[str, Any]:
    """DESCRIBE_QUEUE: partitions, offsets, bytes on disk, every group (committed offsets, lag,
    members, leases) and the live subscriptions. ``brief`` (the metrics): without the settings,
    the subscriptions and the dead letters. ``group_names``: the queue's groups, when the caller
    read every queue's at once (``Metadata.groups_by_queue``; one ``groups`` a queue reads the
    group table each time)."""
    settings = broker.store.settings(name)
    parts: list[dict[str, Any]] = []
    for p in range(settings.log_partitions):
        plog = broker.store.partition(name, p)
        parts.append(  # one row per partition
            {
                "partition": p,
                "log_start_offset": plog.log_start_offset,
                "high_watermark": broker._visible.get((name, p), plog.next_offset),
                "next_offset": plog.next_offset,
                "messages": plog.next_offset - plog.log_start_offset,
                "size_bytes": plog.size_bytes,
                "segments": plog.segment_count,
                **({"refused": plog.refused} if plog.refused else {}),
            }
        )
    groups: dict[str, dict[str, Any]] = {}
    for group in broker.store.meta.groups(name) if group_names is None else group_names:
        committed = broker.store.meta.committed(name, group)
        lag = {  # what retention or a purge removed is not lag: it can no longer be read
            str(x["partition"]): x["high_watermark"]
            - max(committed.get(x["partition"], x["log_start_offset"]), x["log_start_offset"])
            for x in parts
        }
        groups[group] = {
            "committed": {str(k): v for k, v in committed.items()},
            "lag": lag,
            "total_lag": sum(lag.values()),
        }
    subs = [] if brief else [s.describe() for s in broker.subs.by_id.values() if s.queue == name]
    hws = {x["partition"]: x["high_watermark"] for x in parts}
    for gname, info in broker.shared.describe(name, hws, broker._now_ms).items():
        groups.setdefault(gname, {}).update(info)
    for gname, info in broker.streams.describe(name).items():
        groups.setdefault(gname, {}).update(info)
    now = broker._now_ms
    for info in groups.values():
        # lag in seconds: how old the oldest message the group has not consumed (stream: committed
        # offset; queue: oldest unsettled) is, by its batch's timestamp; 0 when caught up
        starts = info.get("floors") if info.get("kind") == "queue" else info.get("committed", {})
        ages = []
        for x in parts:
            at = (starts or {}).get(str(x["partition"]), x["log_start_offset"])
            ts = _timestamp_at(broker, name, x["partition"], at, x["high_watermark"])
            ages.append(max(0, now - ts) if ts is not None else 0)
        info["lag_seconds"] = round(max(ages, default=0) / 1000, 3)
        if info.get("kind") == "queue":
            info["oldest_unsettled_age_seconds"] = info["lag_seconds"]
    return {
        "name": name,
        "partitions": settings.partitions,
        "priority_levels": settings.priority_levels,
        "encrypted": settings.encrypt,  # records encrypted at rest ([security] at_rest_key_file)
        "messages": sum(x["messages"] for x in parts),
        "delayed": broker.timers.describe(name),
        "dead_letters": _dead_letters(broker, name, settings.dead_letter_queue or name + ".dlq")
        if dead_letters and not brief
        else None,
        "size_bytes": sum(x["size_bytes"] for x in parts),
        "settings": None if brief else settings.to_dict(),
        "partition_detail": parts,
        "groups": groups,
        **({"direct_consumers": broker.direct_consumers(name)} if settings.mode == "direct" else {}),
        "subscriptions": subs,
    }


def list_page(
    names: Sequence[str], start: str | None, prefix: str | None, limit: int, budget: int = LIST_PAGE_BYTES
) -> tuple[list[str], str | None]:
    """LIST_QUEUES' page of ``names`` (sorted): the names from ``start`` on that begin with
    ``prefix``, at most ``limit`` of them and about ``budget`` bytes of entries (however long the
    names, a page fits the params frame), and the name the next page starts at (None: the last
    page). A prefix's names are contiguous in name order, so the page is found by bisection and
    only its own names are looked at: a page costs the same wherever it is in the list."""
    prefix = prefix or ""
    page: list[str] = []
    size = 0
    for i in range(bisect.bisect_left(names, max(start or "", prefix)), len(names)):
        name = names[i]
        if not name.startswith(prefix):
            break
        size += len(name) + LIST_ENTRY_BYTES
        if page and (len(page) >= limit or size > budget):  # one name at least: a walk always ends
            return page, name
        page.append(name)
    return page, None


def queue_summary(broker: Broker, name: str) -> dict[str, Any]:
    """LIST_QUEUES' entry for a queue this node holds: DESCRIBE_QUEUE's name, partitions, messages
    and size_bytes, without the groups, subscriptions and timestamps a description reads (a
    page describes up to 5000 queues in one turn of the node's loop)."""
    settings = broker.store.settings(name)
    messages = size = 0
    for p in range(settings.log_partitions):
        plog = broker.store.partition(name, p)
        messages += plog.next_offset - plog.log_start_offset
        size += plog.size_bytes
    out: dict[str, Any] = {"name": name, "partitions": settings.partitions, "messages": messages, "size_bytes": size}
    if settings.dead_letter_queue:
        out["dead_letter_queue"] = settings.dead_letter_queue
    return out


def _timestamp_at(broker: Broker, queue: str, p: int, offset: int, upto: int) -> int | None:
    """The producer timestamp (ms) of the batch holding ``offset``, or None at or past ``upto``."""
    if offset >= upto:
        return None
    plog = broker.store.partition(queue, p)
    try:
        data = plog.read(max(offset, plog.log_start_offset), 1)
    except FabricError:
        return None
    if len(data) < HEADER_SIZE:
        return None
    return parse_header(data).first_timestamp


DLQ_SCAN_RECORDS = 100_000


def _dead_letters(broker: Broker, queue: str, dlq: str) -> dict[str, Any] | None:
    """The queue's DLQ: its size and how many of its messages came from ``queue`` for each reason.

    Reasons are read from the ``x-dlq-reason`` headers of the newest DLQ_SCAN_RECORDS
    messages per partition (``reasons_sampled`` says when the DLQ is longer)."""
    if dlq not in broker.store.queue_names() or dlq == queue:
        return None
    reasons: dict[str, int] = {}
    total = 0
    sampled = False
    for plog in broker.store.partitions(dlq):
        total += plog.next_offset - plog.log_start_offset
        offset = max(plog.log_start_offset, plog.next_offset - DLQ_SCAN_RECORDS)
        sampled |= offset > plog.log_start_offset
        try:
            for data, pos, _ in plog.batches(offset, plog.next_offset):
                for hdrs in decode_records(data, pos).headers or ():
                    if hdrs.get("x-dlq-source", b"").decode(errors="replace") == queue:
                        reason = hdrs.get("x-dlq-reason", b"unknown").decode(errors="replace")
                        reasons[reason] = reasons.get(reason, 0) + 1
        except FabricError:
            sampled = True
    return {"queue": dlq, "messages": total, "reasons": reasons, "reasons_sampled": sampled}
