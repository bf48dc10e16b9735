"""What DESCRIBE_QUEUE (and LIST_QUEUES, the CLI's describe and group commands) report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fabric.router.broker import Broker


def describe_queue(broker: Broker, name: str) -> dict[str, Any]:
    """DESCRIBE_QUEUE: partitions, offsets, bytes on disk, every group (committed offsets, lag,
    members, leases) and the live subscriptions."""
    settings = broker.store.settings(name)
    parts = []
    for p in range(settings.partitions):
        plog = broker.store.partition(name, p)
        parts.append(
            {
                "partition": p,
                "log_start_offset": plog.log_start_offset,
                "high_watermark": broker._visible.get((name, p), plog.next_offset),
                "next_offset": plog.next_offset,
                "messages": plog.next_offset - plog.log_start_offset,
                "size_bytes": plog.size_bytes,
                "segments": plog.segment_count,
            }
        )
    groups = {}
    for group in broker.store.meta.groups(name):
        committed = broker.store.meta.committed(name, group)
        lag = {
            str(x["partition"]): x["high_watermark"] - committed.get(x["partition"], x["log_start_offset"])
            for x in parts
        }
        groups[group] = {
            "committed": {str(k): v for k, v in committed.items()},
            "lag": lag,
            "total_lag": sum(lag.values()),
        }
    subs = [s.describe() for s in broker.subs.by_id.values() if s.queue == name]
    hws = {x["partition"]: x["high_watermark"] for x in parts}
    for gname, info in broker.shared.describe(name, hws, broker._now_ms).items():
        groups.setdefault(gname, {}).update(info)
    for gname, info in broker.streams.describe(name).items():
        groups.setdefault(gname, {}).update(info)
    return {
        "name": name,
        "partitions": settings.partitions,
        "messages": sum(x["messages"] for x in parts),
        "size_bytes": sum(x["size_bytes"] for x in parts),
        "settings": settings.to_dict(),
        "partition_detail": parts,
        "groups": groups,
        "subscriptions": subs,
    }
