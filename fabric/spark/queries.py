"""Retention holds of streaming queries: a query registers as the consumer group ``spark.<name>``.

A streaming source with ``queryName`` commits, as that group, the offsets Spark has told it are
done (``commit(end)``) and, when the query is new, its starting offsets. The node keeps every
segment that holds an offset at or after the smallest committed offset of any ``spark.*`` group
of the queue, whatever the queue's retention says (``docs/spark.md``), so a query stopped for
longer than the retention finds its data when it restarts. ``fabric spark queries`` lists the
holds, ``fabric spark forget QUERY`` removes one (the node then deletes what only it held).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fabric.client import Admin

PREFIX = "spark."


def group_of(query: str) -> str:
    return PREFIX + query


def hold_retention(admin: Admin, queue: str, query: str, offsets: Mapping[str, int]) -> None:
    """Commit ``offsets`` (``{"<partition>": next offset}``) as the query's group."""
    admin.commit(queue, group_of(query), {int(p): int(o) for p, o in offsets.items()})


def list_queries(admin: Admin) -> list[dict[str, Any]]:
    """Every registered query: queue, query name, committed offsets, lag (records held)."""
    rows = []
    for q in admin.list_queues():
        if q.get("messages") is None:
            continue
        for name, g in sorted(admin.groups(q["name"]).items()):
            if name.startswith(PREFIX):
                rows.append(
                    {
                        "query": name[len(PREFIX) :],
                        "queue": q["name"],
                        "committed": g.get("committed", {}),
                        "lag": g.get("total_lag"),
                    }
                )
    return rows


def forget(admin: Admin, query: str, queue: str | None = None) -> list[str]:
    """Remove the query's hold on ``queue`` (or on every queue it holds); returns those queues."""
    queues = [queue] if queue else sorted({r["queue"] for r in list_queries(admin) if r["query"] == query})
    for q in queues:
        admin.delete_group(q, group_of(query))
    return queues
