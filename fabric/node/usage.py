"""Usage records for audit and billing: what was produced to and consumed from each queue, written
by the node into its own queue ``__usage`` (the seeds' "usage data collection").

Theory of operation
-------------------
Nothing is added to the hot path: the broker already counts messages and bytes stored per queue
(per PRODUCE request, for metrics) and the push registry what it sent per queue. Every
``usage_interval_ms`` (``[node]``, default 60 s; 0 turns usage records off) the recorder takes the
difference since its last flush and appends one record batch to ``__usage`` partition 0, one record
per (principal, queue, operation) that moved, each a JSON object::

    {"principal": "anonymous", "queue": "orders", "operation": "produce",
     "messages": 1200, "bytes": 150344, "start_ms": ..., "end_ms": ..., "node": "node-1"}

``bytes`` are record-batch bytes as stored and pushed (headers and framing included: what the
node's disk and network carried). ``principal`` is ``anonymous`` until clients authenticate
(issue 12): the records already carry the field so reports keep their shape. ``__usage`` is
created on the first flush (1 partition, fsync interval, kept 31 days) and is readable like any
queue (``fabric recv __usage``, the Spark source); clients may not write to or create ``__`` queues.
Usage of ``__usage`` itself is not recorded. A clean stop flushes what is pending; a crash loses
at most one interval of usage, never data.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from fabric.errors import FabricError
from fabric.protocol.batch import encode_batch
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.usage")

USAGE_QUEUE = "__usage"
USAGE_RETENTION_MS = 31 * 24 * 3600 * 1000
PRINCIPAL = "anonymous"


class UsageRecorder:
    def __init__(self, broker: Broker, interval_ms: int, now_ms: int) -> None:
        self.broker = broker
        self.interval_ms = interval_ms
        self._since = now_ms
        self._next = now_ms + interval_ms
        self._seen_in: dict[str, tuple[int, int]] = {}
        self._seen_out: dict[str, tuple[int, int]] = {}

    def tick(self, now_ms: int) -> None:
        if self.interval_ms and now_ms >= self._next:
            self.flush(now_ms)

    def flush(self, now_ms: int) -> int:
        """Append the usage since the last flush; returns how many records were written."""
        self._next = now_ms + self.interval_ms
        b = self.broker
        rows: list[dict[str, Any]] = []
        for op, totals, seen in (
            ("produce", b.queue_in, self._seen_in),
            ("consume", b.subs.sent_by_queue(), self._seen_out),
        ):
            for queue, (msgs, nbytes) in totals.items():
                if queue == USAGE_QUEUE:
                    continue
                m0, b0 = seen.get(queue, (0, 0))
                if msgs < m0 or nbytes < b0:  # counters restarted (a queue deleted and made again)
                    m0 = b0 = 0
                if msgs > m0 or nbytes > b0:
                    rows.append(
                        {
                            "principal": PRINCIPAL,
                            "queue": queue,
                            "operation": op,
                            "messages": msgs - m0,
                            "bytes": nbytes - b0,
                            "start_ms": self._since,
                            "end_ms": now_ms,
                            "node": b.config.node_id,
                        }
                    )
                seen[queue] = (msgs, nbytes)
        self._since = now_ms
        if not rows:
            return 0
        try:
            if not b.store.has_queue(USAGE_QUEUE):
                settings = {"partitions": 1, "fsync": "interval", "retention_ms": USAGE_RETENTION_MS}
                b.create_queue(USAGE_QUEUE, QueueSettings.from_dict(settings))
            batch = encode_batch(
                [json.dumps(r, separators=(",", ":")).encode() for r in rows],
                keys=[f"{r['principal']}/{r['queue']}/{r['operation']}".encode() for r in rows],
                timestamps=[now_ms] * len(rows),
            )
            b.append_internal(USAGE_QUEUE, 0, bytearray(batch))
        except FabricError as exc:
            b.notices.note(now_ms, ("usage",), len(rows), f"usage records not written ({{n}} rows): {exc.message}")
            return 0
        return len(rows)
