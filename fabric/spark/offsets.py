"""Offsets of the fabric source: parsing the options, admission control, splitting into tasks.

Pure functions over plain dicts: no Spark, no sockets. A source offset is what Spark checkpoints:
a JSON object with one string key per partition log and the **next** offset to read there
(``{"0": 1200, "1": 980}``), so a range ``start..end`` holds offsets ``start[p] <= o < end[p]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from fabric.errors import BadParameter

EARLIEST, LATEST = -2, -1  # in a JSON per-partition spec, as in Kafka's startingOffsets

Offsets = dict[str, int]


@dataclass(frozen=True)
class Spec:
    """A parsed ``startingOffsets`` / ``endingOffsets``: ``at`` is ``earliest``, ``latest`` or a
    timestamp in ms for every partition; ``per_partition`` overrides it per partition (an
    offset, or EARLIEST / LATEST)."""

    at: str | int
    per_partition: Mapping[int, int]


def parse_spec(text: str | None, default: str) -> Spec:
    text = (text or default).strip()
    if text in ("earliest", "latest"):
        return Spec(text, {})
    if text.startswith("timestamp:"):
        try:
            ms = int(text[len("timestamp:") :])
        except ValueError:
            raise BadParameter(f"bad offsets {text!r}: timestamp:<ms since the epoch>") from None
        if ms < 0:
            raise BadParameter(f"bad offsets {text!r}: the timestamp must be >= 0")
        return Spec(ms, {})
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        raise BadParameter(
            f'bad offsets {text!r}: earliest, latest, timestamp:<ms> or JSON like {{"0": 42, "1": -2}}'
        ) from None
    if isinstance(raw, dict) and len(raw) == 1 and isinstance(next(iter(raw.values())), dict):
        raw = next(iter(raw.values()))  # Kafka's {"queue": {"0": 42}} form
    if not isinstance(raw, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in raw.values()):
        raise BadParameter(f"bad offsets {text!r}: a JSON object of partition -> offset (-2 earliest, -1 latest)")
    try:
        per = {int(k): v for k, v in raw.items()}
    except ValueError:
        raise BadParameter(f"bad offsets {text!r}: partition keys are decimal strings") from None
    if any(v < EARLIEST for v in per.values()):
        raise BadParameter(f"bad offsets {text!r}: offsets are >= 0, or -2 (earliest) / -1 (latest)")
    return Spec(default, per)


def cap_rows(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """The end of a batch of at most ``max_rows`` records from ``start`` toward ``latest``, shared
    among partitions in proportion to their backlog (Kafka's rate limit); the rounding remainder
    goes to the partitions in order, so the batch holds exactly ``min(max_rows, backlog)`` records
    and makes progress whenever there is a backlog."""
    backlog = {p: max(0, latest[p] - start.get(p, 0)) for p in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    take = {p: max_rows * b // total for p, b in backlog.items()}
    left = max_rows - sum(take.values())
    for p in sorted(backlog, key=int):
        if left <= 0:
            break
        extra = min(left, backlog[p] - take[p])
        take[p] += extra
        left -= extra
    return {p: start.get(p, 0) + take[p] for p in latest}


def cap_bytes(start: Offsets, latest: Offsets, max_bytes: int, bytes_per_record: float) -> Offsets:
    """As :func:`cap_rows` for a byte budget, counted with the queue's mean stored record size
    (an estimate: whole batches on disk over their records). At least one record per batch."""
    rows = max(1, int(max_bytes // max(1.0, bytes_per_record)))
    return cap_rows(start, latest, rows)


def clamp(end: Offsets, bound: Offsets) -> Offsets:
    """``end`` but nowhere past ``bound`` (the target of Trigger.AvailableNow)."""
    return {p: min(o, bound.get(p, o)) for p, o in end.items()}


def split(start: Offsets, end: Offsets, *, min_partitions: int, max_records: int) -> list[tuple[int, int, int]]:
    """The ranges ``(partition, from, to)`` of one batch, one Spark task each: every partition
    with records is one range, the largest are cut in equal parts until there are
    ``min_partitions`` ranges (spread over the cores), and no range holds more than ``max_records``."""
    ranges = [(int(p), start.get(p, 0), o) for p, o in end.items() if o > start.get(p, 0)]
    if not ranges:
        return []
    total = sum(b - a for _, a, b in ranges)
    out: list[tuple[int, int, int]] = []
    for p, a, b in sorted(ranges):
        n = b - a
        parts = max(1, -(-n // max_records))
        if min_partitions > len(ranges):
            parts = max(parts, round(n * min_partitions / total))
        step = -(-n // parts)
        out.extend((p, lo, min(b, lo + step)) for lo in range(a, b, step))
    return out


def encode(offsets: Mapping[int | str, int]) -> Offsets:
    return {str(p): int(o) for p, o in sorted(offsets.items(), key=lambda kv: int(kv[0]))}
