"""``fabric top``: a live view of a node's (or cluster's) queues, groups and nodes, once a second.

Each refresh asks the node for PING, LIST_QUEUES and DESCRIBE_QUEUE of every queue (what any
client may ask); on a cluster, a PING of every store the map names (through the router, or
straight at the store), whose counters are summed: rates are the change of log end offsets (in) and of the groups' consumed
positions (out) between two refreshes. Three tables sized for an 80-column terminal; wider ones
get the same tables with more room. Ctrl-C leaves it; ``--iterations N`` stops after N refreshes
(for scripts and tests, which also get plain frames when stdout is not a terminal)."""

from __future__ import annotations

import time
from typing import Any

import click

from fabric.cli.common import ENDPOINT, Interrupted, _admin
from fabric.errors import FabricError

WIDTH_MIN = 80
LIMIT = 50  # queues described per refresh, unless asked (--limit): the rest are left out, by size


def _fmt(n: float | None, unit: str = "") -> str:
    if n is None:
        return "-"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.1f}{suffix}{unit}"
    return f"{n:.0f}{unit}" if float(n).is_integer() or abs(n) >= 10 else f"{n:.1f}{unit}"


class Sampler:
    """One refresh of figures, and rates against the previous one."""

    def __init__(self, admin: Any, *, limit: int = LIMIT, prefix: str | None = None) -> None:
        self.admin = admin
        self.limit, self.prefix = limit, prefix
        self._last: dict[str, tuple[float, int, int]] = {}  # queue -> (t, sum of log ends, sum consumed)

    def _chosen(self) -> tuple[list[str], int]:
        """The queues to describe this refresh, by name: every one up to ``limit``, else the
        ``limit`` holding the most messages (the list's pages say, one request per 1,000 queues;
        describing each of 10,000 queues took seconds a refresh). And how many are left out."""
        rows = [q for q in self.admin.list_queues(self.prefix) if not q["name"].startswith("__")]
        left_out = max(0, len(rows) - self.limit)
        if left_out:
            rows = sorted(rows, key=lambda q: -(q.get("messages") or 0))[: self.limit]
        return sorted(q["name"] for q in rows), left_out

    def _ping_store(self, node: str, endpoint: str) -> dict[str, Any] | None:
        """PING of one store of a cluster: through the endpoint given (a router sends it to that
        store), else straight at the store (a store answers for itself whatever is named); None
        when it does not answer."""
        try:
            reply = self.admin.ping(node)
            if reply.get("node") == node:
                return dict(reply)
            from fabric.client import Admin

            with Admin(endpoint, timeout_ms=2000, fail_refused=True) as direct:
                reply = direct.ping()
            return dict(reply) if reply.get("node") == node else None
        except FabricError:
            return None

    def sample(self) -> dict[str, Any]:
        now = time.monotonic()
        ping = self.admin.ping()
        queues = []
        groups = []
        names, left_out = self._chosen()
        for name in names:
            try:
                d = self.admin.describe_queue(name)
            except Exception:  # deleted between the list and the describe, or held elsewhere
                continue
            ends = sum(p["next_offset"] for p in d.get("partition_detail", []))
            consumed = 0
            lag = 0
            lag_s = 0.0
            for gname, g in d.get("groups", {}).items():
                pos = g.get("floors") if g.get("kind") == "queue" else g.get("committed")
                consumed += sum((pos or {}).values())
                glag = g.get("total_lag", g.get("backlog", 0)) or 0
                lag = max(lag, glag)
                lag_s = max(lag_s, g.get("lag_seconds", 0.0) or 0.0)
                groups.append(
                    {
                        "queue": name,
                        "group": gname,
                        "kind": g.get("kind", "stream"),
                        "members": len(g.get("members", []) or []),
                        "lag": glag,
                        "lag_s": g.get("lag_seconds"),
                        "in_flight": g.get("in_flight"),
                    }
                )
            prev = self._last.get(name)
            rate_in = rate_out = None
            if prev is not None and now > prev[0]:
                rate_in = max(0.0, (ends - prev[1]) / (now - prev[0]))
                rate_out = max(0.0, (consumed - prev[2]) / (now - prev[0]))
            self._last[name] = (now, ends, consumed)
            dlq = (d.get("dead_letters") or {}).get("messages")
            queues.append(
                {
                    "queue": name,
                    "parts": d.get("partitions"),
                    "messages": d.get("messages"),
                    "in_s": rate_in,
                    "out_s": rate_out,
                    "backlog": lag,
                    "lag_s": lag_s,
                    "dlq": dlq,
                    "delayed": (d.get("delayed") or {}).get("batches"),
                }
            )
        try:
            meta = self.admin.metadata()
        except Exception:
            meta = {}
        nodes = []
        if meta.get("cluster"):
            for node, endpoint in sorted(meta.get("nodes", {}).items()):
                nodes.append({"node": node, "endpoint": endpoint, **_node_figures(self._ping_store(node, endpoint))})
            stats = _sum_stats([n for n in nodes if n["live"]])
        else:
            nodes.append({"node": ping.get("node"), "endpoint": self.admin.endpoint, **_node_figures(ping)})
            stats = ping.get("stats", {})
        return {
            "ping": ping,
            "queues": queues,
            "groups": groups,
            "nodes": nodes,
            "stats": stats,
            "left_out": left_out,
        }


STAT_KEYS = ("requests", "errors", "records_in")


def _node_figures(ping: dict[str, Any] | None) -> dict[str, Any]:
    if ping is None:
        return {"live": False, "queues": None, **dict.fromkeys(STAT_KEYS)}
    stats = ping.get("stats", {})
    return {"live": True, "queues": ping.get("queues"), **{k: stats.get(k) for k in STAT_KEYS}}


def _sum_stats(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """A cluster's counters: every store's, summed (a router reaches one of them at a time)."""
    return {k: sum(n[k] or 0 for n in nodes) for k in STAT_KEYS}


def _columns(width: int, left: list[str], right: list[str]) -> Any:
    """A borderless table: text columns on the left, right-justified figures after them."""
    from rich.table import Table

    t = Table(expand=False, width=width, show_edge=False, pad_edge=False)
    for col in left:
        t.add_column(col, no_wrap=True, overflow="ellipsis")
    for col in right:
        t.add_column(col, justify="right", no_wrap=True, overflow="ellipsis")
    return t


def render(frame: dict[str, Any], width: int) -> Any:
    from rich.console import Group

    width = max(width, WIDTH_MIN)
    ping, stats = frame["ping"], frame["stats"]
    live = [n for n in frame["nodes"] if n.get("live")]
    where = (
        f"cluster: {len(live)} of {len(frame['nodes'])} store(s) answering"
        if len(frame["nodes"]) > 1
        else f"node {ping.get('node', '?')}"
    )
    head = (
        f"fabric {ping.get('version', '?')}  {where}  queues {ping.get('queues', 0)}  "
        f"requests {_fmt(stats.get('requests'))}  errors {_fmt(stats.get('errors'))}"
    )
    qt = _columns(width, ["queue"], ["parts", "msgs", "in/s", "out/s", "backlog", "lag s", "dlq"])
    for q in frame["queues"]:
        qt.add_row(
            q["queue"],
            str(q["parts"]),
            *(_fmt(q[k]) for k in ("messages", "in_s", "out_s", "backlog", "lag_s", "dlq")),
        )
    gt = _columns(width, ["queue", "group", "kind"], ["members", "lag", "lag s", "in flight"])
    for g in frame["groups"]:
        gt.add_row(
            g["queue"], g["group"], g["kind"], str(g["members"]), *(_fmt(g[k]) for k in ("lag", "lag_s", "in_flight"))
        )
    nt = _columns(width, ["node", "endpoint"], ["queues", "requests", "errors", "records in"])
    for n in frame["nodes"]:
        figures = (_fmt(n.get(k)) for k in ("queues", *STAT_KEYS)) if n.get("live") else ("down", "-", "-", "-")
        nt.add_row(str(n["node"]), str(n["endpoint"]), *figures)
    title = "QUEUES"
    if frame.get("left_out"):
        shown = len(frame["queues"])
        title += f" (the {shown} with the most messages; {frame['left_out']} more: --limit, --prefix)"
    return Group(head, "", title, qt, "", "GROUPS", gt, "", "NODES", nt)


@click.command()
@ENDPOINT
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True, help="Seconds between refreshes."
)
@click.option(
    "--iterations", "-n", type=click.IntRange(min=1), help="Stop after this many refreshes (default: until Ctrl-C)."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=LIMIT,
    show_default=True,
    help="Show at most this many queues: past it, those holding the most messages.",
)
@click.option("--prefix", help="Only queues whose names start with this.")
def top(endpoint: str, interval: float, iterations: int | None, limit: int, prefix: str | None) -> None:
    """A live view of queues (in/out rates, backlog, lag in seconds, DLQ), groups and nodes."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    width = min(console.width, 160) if console.is_terminal else WIDTH_MIN
    with _admin(endpoint, 5000) as admin:
        sampler = Sampler(admin, limit=limit, prefix=prefix)
        count = 0
        if not console.is_terminal:  # plain frames, one after another
            while iterations is None or count < iterations:
                if count:
                    time.sleep(interval)
                console.print(render(sampler.sample(), width), width=width)
                console.print()
                count += 1
            return
        try:
            with Live(render(sampler.sample(), width), console=console, auto_refresh=False, screen=False) as live:
                count = 1
                while iterations is None or count < iterations:
                    time.sleep(interval)
                    live.update(render(sampler.sample(), width), refresh=True)
                    count += 1
        except KeyboardInterrupt:
            raise Interrupted(f"{count} sample(s) shown") from None
