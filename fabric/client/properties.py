"""Message properties on the producer side: checks, PRODUCE params, reply fields, clocks.

Theory of operation
-------------------
``Producer.send`` takes five optional properties. Each gives its message a batch
of its own kind (messages with equal properties share batches), so a send
without them costs nothing more:

- ``delay_ms`` / ``deliver_at_ms``: the node keeps the message, durably, and
  appends it when due (node clock); ``result()`` then has ``offset=None`` and
  ``delayed_until_ms``. Delayed batches are sent without the idempotent
  producer's sequence (the node refuses a delayed batch with one).
- ``ttl_ms``: queue and key_shared subscriptions dead-letter (or drop) the message
  if it is not settled within ``ttl_ms`` of being sent (the queue's
  ``default_ttl_ms`` otherwise). It travels in the batch (``HAS_TTL``).
- ``priority``: 0..priority_levels-1 of the queue; the node writes the message to
  that level's log, and queue subscriptions deliver higher levels first.
- ``dedup_id``: a message whose id the queue saw within its ``dedup_window_ms`` is
  dropped (``result().duplicate``); also written as header ``x-dedup-id`` (from
  which the node rebuilds its window after a restart). Such batches carry no
  producer id either: the id itself makes their retries safe.

Queues with ``ordering = "strict"`` have every record stamped with the process's
hybrid logical clock as its batch goes on the wire (:func:`stamp_clocks`).
"""

from __future__ import annotations

from typing import Any

from fabric.client.batches import Batch
from fabric.client.hlc import CLOCK, header_value
from fabric.errors import BadParameter
from fabric.protocol import frames as fr
from fabric.protocol.batch import TTL_MS_MAX
from fabric.protocol.ops import DEDUP_ID_BYTES_MAX, DELAY_MS_MAX, PRIORITY_MAX, TIME_MS_MAX

Props = tuple[int | None, int | None, int | None, int | None]  # delay_ms, deliver_at_ms, ttl_ms, priority


def check(
    delay_ms: int | None,
    deliver_at_ms: int | None,
    ttl_ms: int | None,
    priority: int | None,
    dedup_id: str | None,
    headers: dict[str, bytes | str] | None,
) -> tuple[Props | None, dict[str, bytes | str] | None]:
    """The properties as a batch carries them (None when there are none), and the headers with
    ``x-dedup-id`` added; BadParameter names a bad one."""
    props: Props | None = None
    if delay_ms is not None or deliver_at_ms is not None or ttl_ms is not None or priority is not None:
        bounds = (
            ("delay_ms", delay_ms, 0, DELAY_MS_MAX),
            ("deliver_at_ms", deliver_at_ms, 0, TIME_MS_MAX),
            ("ttl_ms", ttl_ms, 1, TTL_MS_MAX),
            ("priority", priority, 0, PRIORITY_MAX),
        )
        for name, value, lo, hi in bounds:
            if value is not None and (type(value) is not int or not lo <= value <= hi):
                raise BadParameter(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
        if delay_ms is not None and deliver_at_ms is not None:
            raise BadParameter("give delay_ms or deliver_at_ms, not both")
        props = (delay_ms, deliver_at_ms, ttl_ms, priority)
        if dedup_id is not None and (delay_ms, deliver_at_ms) != (None, None):
            raise BadParameter("a delayed message cannot carry a dedup_id (the node checks ids when it appends)")
    if dedup_id is not None:
        if not isinstance(dedup_id, str) or not 0 < len(dedup_id.encode()) <= DEDUP_ID_BYTES_MAX:
            raise BadParameter(f"dedup_id must be a string of 1..{DEDUP_ID_BYTES_MAX} bytes")
        headers = {**(headers or {}), "x-dedup-id": dedup_id}
    return props, headers


def params(b: Batch, acks: str) -> bytes:
    """PRODUCE params of a batch with properties (not cached: they vary)."""
    delay, at, _, priority = b.props or (None, None, None, None)
    return fr.encode_params(
        {
            "queue": b.queue,
            "partition": b.partition,
            "acks": acks,
            "delay_ms": delay,
            "deliver_at_ms": at,
            "priority": priority,
            "dedup_ids": b.dedup_ids,
        }
    )


def note_reply(b: Batch, reply: dict[str, Any]) -> None:
    """What a reply says beyond the base offset: duplicates, delay, strict-order offsets."""
    b.duplicates = reply.get("duplicates", [])
    b.delayed_until = reply.get("delayed_until")
    record_offsets = reply.get("record_offsets")
    b.record_offsets = record_offsets[0] if record_offsets else None


def stamp_clocks(b: Batch) -> None:
    """Strict ordering: each record gets the process's hybrid clock as it goes on the wire
    (timestamp and header ``x-hlc``), so the node's window covers the trip, not time spent
    waiting in this producer."""
    n = len(b.values)
    clocks = [CLOCK.tick() for _ in range(n)]
    b.timestamps = [c >> 16 for c in clocks]
    headers = b.headers or [None] * n
    b.headers = [{**(h or {}), "x-hlc": header_value(c)} for h, c in zip(headers, clocks)]
