"""Prometheus metrics of a node: counters kept per request and per batch, read at scrape time.

Theory of operation
-------------------
Nothing here runs per message. The broker counts requests by op and errors by code (a list and a
dict increment per request), messages and bytes in per queue (per PRODUCE request), time spent
per request (one ``Histogram.observe``: a bisect and two additions); the push registry keeps
what each subscription sent; the flusher times each fdatasync and counts the requests it covered.

A scrape (``GET /metrics`` on ``[metrics] listen``, served by prometheus-client's HTTP thread)
asks the event loop for a :func:`snapshot`: plain numbers copied on the loop's own thread, so no
structure is read while the loop changes it. The loop runs it between requests; if the loop
does not answer within ``SCRAPE_TIMEOUT_S`` the scrape reports ``fabric_up 0`` and nothing else.
The snapshot's per-queue figures (offsets, lag in messages and seconds, oldest unsettled age,
DLQ depth, delayed messages) come from the same code as DESCRIBE_QUEUE.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from fabric import __version__
from fabric.errors import FabricError
from fabric.federation.report import Counters
from fabric.histogram import COUNT_BUCKETS, LATENCY_BUCKETS
from fabric.protocol.ops import Op

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.metrics")

SCRAPE_TIMEOUT_S = 5.0  # a turn of the loop that does not come within this: the scrape says fabric_up 0
SCRAPE_SLICE = 500  # queues whose figures one turn of the loop copies


def _buckets(h: tuple[list[int], float], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    counts, _ = h
    out: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip((*bounds, float("inf")), counts, strict=True):
        total += n
        out.append(("+Inf" if bound == float("inf") else repr(bound), total))
    return out


def snapshot(broker: Broker) -> dict[str, Any]:
    """Every figure the collector exports, copied on the event loop's thread in one turn."""
    head = snapshot_head(broker)
    queues, replicas = snapshot_queues(broker, head.pop("names"), head.pop("group_names"))
    head["queues"], head["replicas"] = queues, replicas
    return head


def sliced_snapshot(broker: Broker, on_loop: Callable[[Callable[[], Any], float], Any]) -> dict[str, Any] | None:
    """``snapshot``, copied in turns of the loop of ``SCRAPE_SLICE`` queues each (``on_loop`` runs
    a function on the loop's thread and returns its result, None if the loop did not get to it
    in time): at 10,000 queues the figures took the loop 3 s in one turn, a stall of every request
    at every scrape. Each slice is consistent in itself; slices are a few milliseconds apart."""
    head = on_loop(lambda: snapshot_head(broker), SCRAPE_TIMEOUT_S)
    if head is None:
        return None
    names, groups = head.pop("names"), head.pop("group_names")
    head["queues"], head["replicas"] = {}, []
    for i in range(0, len(names), SCRAPE_SLICE):
        got = on_loop(functools.partial(snapshot_queues, broker, names[i : i + SCRAPE_SLICE], groups), SCRAPE_TIMEOUT_S)
        if got is None:
            return None
        head["queues"].update(got[0])
        head["replicas"].extend(got[1])
    return head


def load_counters(broker: Broker) -> Counters:
    """What the store counted since it started (stored by PRODUCE, pushed to consumers) and its
    data directory's filesystem now: the federation's load figures (fabric.federation.report).
    On the event loop's thread."""
    stored = broker.queue_in.values()
    sent = broker.subs.sent_by_queue().values()
    try:
        st = os.statvfs(broker.store.data_dir)
        free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    except OSError:
        free = total = 0
    return Counters(
        in_messages=sum(v[0] for v in stored),
        in_bytes=sum(v[1] for v in stored),
        out_messages=sum(v[0] for v in sent),
        out_bytes=sum(v[1] for v in sent),
        disk_used_bytes=max(0, total - free),
        disk_free_bytes=free,
    )


def snapshot_head(broker: Broker) -> dict[str, Any]:
    """The node-wide figures, and the names of the queues (and their groups) to copy after."""
    ops = {Op(i).name.lower(): n for i, n in enumerate(broker.op_counts) if n and i in Op._value2member_map_}
    try:
        st = os.statvfs(broker.store.data_dir)
        disk = {"free": st.f_bavail * st.f_frsize, "total": st.f_blocks * st.f_frsize}
    except OSError:
        disk = {}
    flusher = broker.flusher
    return {
        "node": broker.config.node_id,
        "ops": ops,
        "errors": dict(broker.error_counts),
        "dropped_replies": broker.stats.get("dropped_replies", 0),
        "in": {q: list(v) for q, v in broker.queue_in.items()},
        "out": broker.subs.sent_by_queue(),
        "latency": {Op(op).name.lower(): h.copy() for op, h in broker.latency.items()},
        "fsync": flusher.fsync_seconds.copy(),
        "replication": {k: h.copy() for k, h in broker.replication.stage_seconds.items()}
        if broker.replication is not None
        else {},
        "gc": [h.copy() for h in broker.heap.pauses] if broker.heap is not None else [],
        "group_commit": flusher.round_requests.copy(),
        "idle": [broker.idle_poll.spells, broker.idle_poll.spun] if broker.idle_poll is not None else [],
        "disk": disk,
        "throttle_ms": dict(broker.quotas.throttled_ms),
        "throttled": dict(broker.quotas.refused),
        "auth_refused": dict(broker.access.refused) if broker.access is not None else {},
        "names": broker.store.queue_names(),
        "group_names": broker.store.meta.groups_by_queue(),
    }


def snapshot_queues(
    broker: Broker, names: list[str], group_names: dict[str, list[str]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The figures of queues ``names`` (those still there) and of their replicas: offsets, lag in
    messages and seconds, oldest unsettled age, delayed batches, DLQ depth, ISR and follower lag."""
    from fabric.node.admin import describe_queue

    store = broker.store
    queues: dict[str, Any] = {}
    replicas: list[dict[str, Any]] = []
    for name in names:
        if not store.has_queue(name):
            continue  # deleted since the names were read
        try:
            d = describe_queue(broker, name, brief=True, group_names=group_names.get(name, []))
        except FabricError:
            continue
        settings = store.settings(name)
        dlq = settings.dead_letter_queue or name + ".dlq"
        dlq_messages = None
        if dlq != name and store.has_queue(dlq):
            dlq_messages = sum(p.next_offset - p.log_start_offset for p in store.partitions(dlq))
        queues[name] = {
            "partitions": d["partition_detail"],
            "groups": {
                g: {
                    "lag": info.get("total_lag", info.get("backlog", 0)),
                    "lag_seconds": info.get("lag_seconds", 0.0),
                    "oldest_unsettled_age_seconds": info.get("oldest_unsettled_age_seconds"),
                    "in_flight": info.get("in_flight"),
                }
                for g, info in d["groups"].items()
            },
            "delayed_batches": d["delayed"].get("batches", 0),
            "dlq_messages": dlq_messages,
        }
        replicas.extend(broker.placement.replica_rows(name, settings.log_partitions))
    return queues, replicas


class NodeCollector(Collector):
    """Turns a loop-side snapshot into metric families (runs on the HTTP server's thread)."""

    def __init__(self, ask: Callable[[], dict[str, Any] | None]) -> None:
        self._ask = ask

    def collect(self) -> Iterator[Metric]:
        s = self._ask()
        up = GaugeMetricFamily("fabric_up", "1 when the node's event loop answered this scrape in time")
        up.add_metric([], 0 if s is None else 1)
        yield up
        if s is None:
            return
        info = GaugeMetricFamily("fabric_info", "The node's id and version", labels=["node", "version"])
        info.add_metric([s["node"], __version__], 1)
        yield info
        yield from self._traffic(s)
        yield from self._queues(s)
        yield from self._replicas(s)
        yield from self._limits(s)

    @staticmethod
    def _limits(s: dict[str, Any]) -> Iterator[Metric]:
        t = CounterMetricFamily(
            "fabric_throttle_seconds",
            "Waits told to producers over a quota, summed: throttle_ms of replies, retry_after_ms of THROTTLED",
            labels=["target"],
        )
        for target, ms in sorted(s.get("throttle_ms", {}).items()):
            t.add_metric([target], ms / 1000)
        yield t
        r = CounterMetricFamily(
            "fabric_throttled_requests", "PRODUCE refused THROTTLED (quota in debt)", labels=["target"]
        )
        for target, n in sorted(s.get("throttled", {}).items()):
            r.add_metric([target], n)
        yield r
        a = CounterMetricFamily("fabric_auth_refused", "Requests refused NOT_AUTHORIZED", labels=["principal"])
        for principal, n in sorted(s.get("auth_refused", {}).items()):
            a.add_metric([principal], n)
        yield a

    @staticmethod
    def _traffic(s: dict[str, Any]) -> Iterator[Metric]:
        req = CounterMetricFamily("fabric_requests", "Requests handled, by op", labels=["op"])
        for op, n in sorted(s["ops"].items()):
            req.add_metric([op], n)
        yield req
        err = CounterMetricFamily("fabric_errors", "Requests answered with an error, by error code", labels=["code"])
        for code, n in sorted(s["errors"].items()):
            err.add_metric([code], n)
        yield err
        dropped = CounterMetricFamily("fabric_dropped_replies", "Replies and pushes to clients that were gone")
        dropped.add_metric([], s["dropped_replies"])
        yield dropped
        for direction in ("in", "out"):
            verb = "stored by producers' requests" if direction == "in" else "pushed to consumers"
            m = CounterMetricFamily(f"fabric_messages_{direction}", f"Messages {verb}", labels=["queue"])
            b = CounterMetricFamily(f"fabric_bytes_{direction}", f"Bytes {verb}", labels=["queue"])
            for q, pair in sorted(s[direction].items()):
                m.add_metric([q], pair[0])
                b.add_metric([q], pair[1])
            yield m
            yield b
        lat = HistogramMetricFamily(
            "fabric_request_duration_seconds",
            "Time the node's loop spent on a request (a durable PRODUCE then waits for fdatasync too)",
            labels=["op"],
        )
        for op, h in sorted(s["latency"].items()):
            lat.add_metric([op], _buckets(h, LATENCY_BUCKETS), sum_value=h[1])
        yield lat
        fs = HistogramMetricFamily("fabric_fsync_duration_seconds", "fdatasync calls of the group-commit flusher")
        fs.add_metric([], _buckets(s["fsync"], LATENCY_BUCKETS), sum_value=s["fsync"][1])
        yield fs
        if s.get("replication"):
            rs = HistogramMetricFamily(
                "fabric_replication_stage_seconds",
                "Leader: isr_wait, an acks=all append durable here until its reply (the followers' "
                "fetches passing it); follower_fetch, an answer with data until that follower's next fetch",
                labels=["stage"],
            )
            for stage, h in sorted(s["replication"].items()):
                rs.add_metric([stage], _buckets(h, LATENCY_BUCKETS), sum_value=h[1])
            yield rs
        gc = HistogramMetricFamily("fabric_group_commit_requests", "Requests made durable by one flusher round")
        gc.add_metric([], _buckets(s["group_commit"], COUNT_BUCKETS), sum_value=s["group_commit"][1])
        yield gc
        if s["gc"]:
            pauses = HistogramMetricFamily(
                "fabric_gc_pause_seconds",
                "Collections of CPython's cyclic garbage collector, by generation (the node's loop waits meanwhile)",
                labels=["generation"],
            )
            for generation, h in enumerate(s["gc"]):
                pauses.add_metric([str(generation)], _buckets(h, LATENCY_BUCKETS), sum_value=h[1])
            yield pauses
        if s.get("idle"):
            spells = CounterMetricFamily(
                "fabric_idle_spells", "Times the loop ran out of work (each ended by a request or a timer)"
            )
            spells.add_metric([], s["idle"][0])
            yield spells
            spun = CounterMetricFamily(
                "fabric_idle_polled_spells",
                "Idle spells the loop spent polling (up to [node] idle_poll_us) before it slept",
            )
            spun.add_metric([], s["idle"][1])
            yield spun
        if s["disk"]:
            free = GaugeMetricFamily("fabric_disk_free_bytes", "Free bytes on the data directory's file system")
            free.add_metric([], s["disk"]["free"])
            yield free
            total = GaugeMetricFamily("fabric_disk_total_bytes", "Size of the data directory's file system")
            total.add_metric([], s["disk"]["total"])
            yield total

    @staticmethod
    def _queues(s: dict[str, Any]) -> Iterator[Metric]:
        pl = ["queue", "partition"]
        start = GaugeMetricFamily("fabric_log_start_offset", "First offset still stored", labels=pl)
        end = GaugeMetricFamily("fabric_log_end_offset", "Next offset to be written", labels=pl)
        hw = GaugeMetricFamily("fabric_high_watermark", "Offsets below it are visible to consumers", labels=pl)
        size = GaugeMetricFamily("fabric_partition_size_bytes", "Bytes on disk", labels=pl)
        gl = ["queue", "group"]
        lag = GaugeMetricFamily("fabric_consumer_lag_messages", "Messages the group has not consumed", labels=gl)
        lag_s = GaugeMetricFamily(
            "fabric_consumer_lag_seconds", "Age of the oldest message the group has not consumed", labels=gl
        )
        unacked = GaugeMetricFamily(
            "fabric_oldest_unacked_age_seconds", "Queue groups: age of the oldest unsettled message", labels=gl
        )
        inflight = GaugeMetricFamily("fabric_in_flight_messages", "Queue groups: leased, not yet acked", labels=gl)
        dlq = GaugeMetricFamily("fabric_dlq_messages", "Messages in the queue's dead-letter queue", labels=["queue"])
        delayed = GaugeMetricFamily(
            "fabric_delayed_batches", "Batches waiting for their delivery time", labels=["queue"]
        )
        for q, d in sorted(s["queues"].items()):
            for x in d["partitions"]:
                labels = [q, str(x["partition"])]
                start.add_metric(labels, x["log_start_offset"])
                end.add_metric(labels, x["next_offset"])
                hw.add_metric(labels, x["high_watermark"])
                size.add_metric(labels, x["size_bytes"])
            for g, info in sorted(d["groups"].items()):
                lag.add_metric([q, g], info["lag"] or 0)
                lag_s.add_metric([q, g], info["lag_seconds"] or 0.0)
                if info["oldest_unsettled_age_seconds"] is not None:
                    unacked.add_metric([q, g], info["oldest_unsettled_age_seconds"])
                if info["in_flight"] is not None:
                    inflight.add_metric([q, g], info["in_flight"])
            if d["dlq_messages"] is not None:
                dlq.add_metric([q], d["dlq_messages"])
            delayed.add_metric([q], d["delayed_batches"])
        yield from (start, end, hw, size, lag, lag_s, unacked, inflight, dlq, delayed)

    @staticmethod
    def _replicas(s: dict[str, Any]) -> Iterator[Metric]:
        if not s["replicas"]:
            return
        pl = ["queue", "partition"]
        isr = GaugeMetricFamily("fabric_partition_isr_size", "In-sync replicas of a partition held here", labels=pl)
        leader = GaugeMetricFamily("fabric_partition_leader", "1 when this node leads the partition", labels=pl)
        lag = GaugeMetricFamily(
            "fabric_replication_lag_messages", "Leader: how far its slowest in-sync follower is behind", labels=pl
        )
        under = GaugeMetricFamily(
            "fabric_under_replicated_partitions", "Leader: 1 when the ISR is smaller than the replica set", labels=pl
        )
        for row in s["replicas"]:
            labels = [row["queue"], str(row["partition"])]
            isr.add_metric(labels, row["isr"])
            leader.add_metric(labels, row["leader"])
            if row["leader"]:
                lag.add_metric(labels, row["lag"])
                under.add_metric(labels, row["under_replicated"])
        yield from (isr, leader, lag, under)
