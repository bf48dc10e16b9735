"""Idempotent producers: each retried batch stored once, gaps refused, zombies fenced.

Theory of operation
-------------------
A producer that wants exactly-once appends gets a ``producer_id`` and an
``epoch`` (from ``ProducerIdAllocator``) and numbers its records per partition:
``base_sequence`` of a batch is the sequence of its first record, counting from 0
in each epoch and wrapping from 2**31 - 1 to 0. ``ProducerStates`` is the leader's
memory of one partition's producers (Kafka's ``ProducerStateManager``): per id,
the newest epoch, the sequence the next batch must start at, and the last
``recent`` batches of that epoch with the offsets they were stored at. The store
calls ``check`` before an append and ``record`` after it. ``check`` decides:

================================  ========================================  ===================
batch                             condition                                 outcome
================================  ========================================  ===================
producer_id < 0                   (not idempotent)                          append
unknown producer id               base_sequence = 0                         append
unknown producer id               base_sequence != 0                        OutOfOrderSequence
epoch < known epoch               (a zombie: a newer instance has written)  ProducerFenced
epoch > known epoch               base_sequence = 0                         append (new epoch)
epoch > known epoch               base_sequence != 0                        OutOfOrderSequence
same epoch                        same sequence and count as a recent batch duplicate: its offset
same epoch                        base_sequence = next sequence             append
same epoch                        anything else (a gap, or too old)         OutOfOrderSequence
================================  ========================================  ===================

A producer keeps at most ``recent`` (16) batches in flight, so a retry is always
of one of the last ``recent`` batches and is answered with the original offsets.

Decisions and limits
--------------------
* **An unknown producer must start at sequence 0.** Kafka 3 accepts any
  sequence from a producer it has no state for; that lets a lost first batch
  through silently. Here the state of an idle producer is forgotten after
  ``expiry_ms`` (7 days) or when ``max_producers`` is exceeded (least recently
  active first); such a producer's next batch is refused with
  ``OutOfOrderSequence`` and it must get a new epoch (which starts at 0).
* ``rebuild`` replays the log without checking sequences: the log is the truth.
  A batch with an older epoch than one already replayed, or with fields out of
  range, is skipped (it could not have passed ``check``).
* ``truncate`` only knows the last ``recent`` batches of each producer. When the
  truncation reaches past them, the next sequence is unknown: the producer's
  epoch stays (older epochs stay fenced) but every batch of that epoch is refused
  until it moves to a new epoch. For an exact state, restore a snapshot taken at
  or below the truncation offset and ``rebuild`` from the log.
* Snapshots record ``end_offset``, the log end they cover; ``rebuild`` skips
  headers below it, so recovery is ``restore(snapshot)`` then ``rebuild`` of
  (at least) the segments from ``end_offset`` on.

Snapshot format (JSON, ``version`` 1)::

    {"version": 1, "end_offset": int,
     "producers": [[producer_id, epoch, next_sequence | null, last_ms, floor_offset | null,
                    [[base_sequence, record_count, base_offset], ...]], ...]}

producers least recently active first; ``floor_offset`` is the offset of the
newest batch of the epoch no longer among the recent ones.

Everything here is pure: no files, no clock.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fabric.errors import BadParameter, InternalError, OutOfOrderSequence, ProducerFenced
from fabric.protocol.batch import RECORD_COUNT_MAX, BatchHeader

SEQUENCE_MOD = 2**31  # sequences wrap from 2**31 - 1 to 0
EPOCH_MAX = 2**15 - 1  # producer_epoch is an i16
PRODUCER_ID_MAX = 2**63 - 1
OFFSET_MAX = 2**63 - 1
RECENT = 16  # batches remembered per producer: a producer keeps no more in flight (fabric.client)
RECENT_MAX = 64
SNAPSHOT_VERSION = 1
SNAPSHOT_BYTES_MAX = 256 * 1024 * 1024
NAME_BYTES_MAX = 255

DEFAULT_EXPIRY_MS = 7 * 24 * 3600 * 1000


@dataclass(slots=True)
class _Batch:
    base_sequence: int
    record_count: int
    base_offset: int


@dataclass(slots=True)
class _Producer:
    epoch: int
    next_sequence: int | None  # None: unknown after a deep truncation; only a new epoch may write
    last_ms: int
    floor_offset: int | None = None  # newest batch of this epoch evicted from ``batches``
    batches: deque[_Batch] = field(default_factory=deque)


def _check_fields(producer_id: int, epoch: int, base_sequence: int, record_count: int) -> None:
    """A peer's header fields out of their ranges: BadParameter."""
    if producer_id > PRODUCER_ID_MAX:
        raise BadParameter(f"producer_id {producer_id} out of range")
    if not 0 <= epoch <= EPOCH_MAX:
        raise BadParameter(f"producer {producer_id}: epoch must be 0..{EPOCH_MAX}, got {epoch}")
    if not 0 <= base_sequence < SEQUENCE_MOD:
        raise BadParameter(f"producer {producer_id}: base_sequence must be 0..{SEQUENCE_MOD - 1}, got {base_sequence}")
    if not 1 <= record_count <= RECORD_COUNT_MAX:
        raise BadParameter(f"producer {producer_id}: record_count must be 1..{RECORD_COUNT_MAX}, got {record_count}")


class ProducerStates:
    """The idempotent producers of one partition: what the leader checks each batch against."""

    def __init__(
        self, *, expiry_ms: int = DEFAULT_EXPIRY_MS, max_producers: int = 100_000, recent: int = RECENT
    ) -> None:
        if expiry_ms <= 0:
            raise ValueError(f"expiry_ms must be positive, got {expiry_ms}")
        if max_producers < 1:
            raise ValueError(f"max_producers must be at least 1, got {max_producers}")
        if not 1 <= recent <= RECENT_MAX:
            raise ValueError(f"recent must be 1..{RECENT_MAX}, got {recent}")
        self.expiry_ms = expiry_ms
        self.max_producers = max_producers
        self.recent = recent
        self.end_offset = 0  # the log end this state covers
        self.evicted = 0  # producers forgotten because max_producers was reached
        self._producers: OrderedDict[int, _Producer] = OrderedDict()  # least recently active first
        self._clock_ms = 0  # newest now_ms seen: time never runs backwards in here

    def __len__(self) -> int:
        return len(self._producers)

    def __contains__(self, producer_id: object) -> bool:
        return producer_id in self._producers

    def __repr__(self) -> str:
        return f"ProducerStates({len(self._producers)} producers, end_offset {self.end_offset})"

    def epoch(self, producer_id: int) -> int | None:
        """The newest epoch of ``producer_id`` in this partition, None if unknown."""
        entry = self._producers.get(producer_id)
        return None if entry is None else entry.epoch

    def next_sequence(self, producer_id: int) -> int | None:
        """The sequence the producer's next batch must start at (None if unknown or lost to a truncation)."""
        entry = self._producers.get(producer_id)
        return None if entry is None else entry.next_sequence

    # ----------------------------------------------------------------- check

    def check(self, producer_id: int, epoch: int, base_sequence: int, record_count: int, now_ms: int) -> int | None:
        """Decide a batch before it is appended (see the table on top).

        None: append it. An int: it duplicates a stored batch; that batch's base
        offset. Raises ``OutOfOrderSequence``, ``ProducerFenced`` or (fields out
        of range) ``BadParameter``. Changes nothing.
        """
        if producer_id < 0:
            return None
        _check_fields(producer_id, epoch, base_sequence, record_count)
        entry = self._producers.get(producer_id)
        if entry is None:
            if base_sequence != 0:
                raise OutOfOrderSequence(
                    f"producer {producer_id} is unknown to this partition (new, or its state expired): "
                    f"its first batch must have sequence 0, not {base_sequence}; get a new epoch"
                )
            return None
        if epoch < entry.epoch:
            raise ProducerFenced(f"producer {producer_id} epoch {epoch} is fenced: epoch {entry.epoch} has written")
        if epoch > entry.epoch:
            if base_sequence != 0:
                raise OutOfOrderSequence(
                    f"producer {producer_id}: new epoch {epoch} must start at sequence 0, not {base_sequence}"
                )
            return None
        expected = entry.next_sequence
        if base_sequence == expected:
            return None  # the next batch (the kept batches all start before it): the common case first
        for batch in entry.batches:
            if batch.base_sequence == base_sequence:
                if batch.record_count != record_count:
                    raise OutOfOrderSequence(
                        f"producer {producer_id} epoch {epoch}: batch at sequence {base_sequence} has "
                        f"{record_count} records, the stored one {batch.record_count}"
                    )
                return batch.base_offset
        if expected is None:
            raise OutOfOrderSequence(
                f"producer {producer_id} epoch {epoch}: its sequence was lost when the log was truncated; "
                "get a new epoch"
            )
        ahead = (base_sequence - expected) % SEQUENCE_MOD
        if ahead < SEQUENCE_MOD // 2:
            raise OutOfOrderSequence(
                f"producer {producer_id} epoch {epoch}: sequence {base_sequence} skips ahead of {expected} "
                f"({ahead} records missing)"
            )
        raise OutOfOrderSequence(
            f"producer {producer_id} epoch {epoch}: sequence {base_sequence} is older than the last "
            f"{len(entry.batches)} batches kept (next is {expected})"
        )

    # ---------------------------------------------------------------- update

    def record(
        self, producer_id: int, epoch: int, base_sequence: int, record_count: int, base_offset: int, now_ms: int
    ) -> None:
        """Remember a batch just appended at ``base_offset`` (after ``check`` said None)."""
        if not 0 <= base_offset <= OFFSET_MAX - record_count:
            raise InternalError(f"base_offset {base_offset} out of range")
        if producer_id >= 0:
            _check_fields(producer_id, epoch, base_sequence, record_count)
            entry = self._producers.get(producer_id)
            if entry is not None and epoch < entry.epoch:
                raise InternalError(f"producer {producer_id}: recording epoch {epoch} after epoch {entry.epoch}")
            self._apply(producer_id, epoch, base_sequence, record_count, base_offset, now_ms)
        self.end_offset = max(self.end_offset, base_offset + record_count)

    def _apply(
        self, producer_id: int, epoch: int, base_sequence: int, record_count: int, base_offset: int, now_ms: int
    ) -> None:
        self._clock_ms = max(self._clock_ms, now_ms)
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = _Producer(epoch, None, self._clock_ms)
            while len(self._producers) > self.max_producers:
                self._producers.popitem(last=False)
                self.evicted += 1
        elif epoch != entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()
            entry.floor_offset = None
        entry.batches.append(_Batch(base_sequence, record_count, base_offset))
        if len(entry.batches) > self.recent:
            entry.floor_offset = entry.batches.popleft().base_offset
        entry.next_sequence = (base_sequence + record_count) % SEQUENCE_MOD
        entry.last_ms = self._clock_ms
        self._producers.move_to_end(producer_id)

    def expire(self, now_ms: int) -> int:
        """Forget producers idle for more than ``expiry_ms``; return how many."""
        self._clock_ms = max(self._clock_ms, now_ms)
        deadline = self._clock_ms - self.expiry_ms
        producers, dropped = self._producers, 0
        while producers:
            producer_id, entry = next(iter(producers.items()))
            if entry.last_ms >= deadline:
                break
            del producers[producer_id]
            dropped += 1
        return dropped

    def rebuild(self, headers: Iterable[BatchHeader], now_ms: int) -> int:
        """Replay the headers of the log (in offset order) from ``end_offset`` on; return how many applied.

        Headers below ``end_offset`` are already covered (by a restored snapshot)
        and skipped, so passing whole segments is fine.
        """
        applied = 0
        for h in headers:
            if h.base_offset < self.end_offset:
                continue
            if h.producer_id >= 0 and self._replayable(h):
                self._apply(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, h.base_offset, now_ms)
                applied += 1
            self.end_offset = max(self.end_offset, h.next_offset)
        return applied

    def _replayable(self, h: BatchHeader) -> bool:
        """A logged batch that could have passed ``check``: fields in range, epoch not older."""
        try:
            _check_fields(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count)
        except BadParameter:
            return False
        entry = self._producers.get(h.producer_id)
        return entry is None or h.producer_epoch >= entry.epoch

    def truncate(self, offset: int) -> int:
        """The log was truncated to ``offset``: forget batches at or after it; return producers changed."""
        changed = 0
        for entry in self._producers.values():
            batches, dropped = entry.batches, None
            while batches and batches[-1].base_offset >= offset:
                dropped = batches.pop()
            if entry.floor_offset is not None and entry.floor_offset >= offset:
                entry.next_sequence = None  # batches older than the recent ones were dropped too
                entry.floor_offset = None
                batches.clear()
                changed += 1
            elif dropped is not None:
                entry.next_sequence = dropped.base_sequence
                changed += 1
        self.end_offset = min(self.end_offset, offset)
        return changed

    # -------------------------------------------------------------- snapshot

    def snapshot(self) -> bytes:
        """The state as versioned JSON (see the module docstring); persist it with ``atomic_write``."""
        producers = [
            [
                pid,
                e.epoch,
                e.next_sequence,
                e.last_ms,
                e.floor_offset,
                [[b.base_sequence, b.record_count, b.base_offset] for b in e.batches],
            ]
            for pid, e in self._producers.items()
        ]
        doc = {"version": SNAPSHOT_VERSION, "end_offset": self.end_offset, "producers": producers}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def restore(
        cls, data: bytes, *, expiry_ms: int = DEFAULT_EXPIRY_MS, max_producers: int = 100_000, recent: int = RECENT
    ) -> ProducerStates:
        """A state from ``snapshot()`` bytes; ``ValueError`` if they are not a valid snapshot.

        With a smaller ``max_producers`` or ``recent`` than the snapshot was taken
        with, the least recently active producers and the oldest batches go.
        """
        states = cls(expiry_ms=expiry_ms, max_producers=max_producers, recent=recent)
        doc = _load_json(data, "producer state")
        if doc.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"producer state snapshot version {doc.get('version')!r}, expected {SNAPSHOT_VERSION}")
        states.end_offset = _int(doc.get("end_offset"), 0, OFFSET_MAX, "end_offset")
        rows = doc.get("producers")
        if not isinstance(rows, list):
            raise ValueError("producer state snapshot: 'producers' is not a list")
        for row in rows[-max_producers:]:
            pid, entry = _parse_producer(row, recent)
            if pid in states._producers:
                raise ValueError(f"producer state snapshot: producer {pid} appears twice")
            states._producers[pid] = entry
            states._clock_ms = max(states._clock_ms, entry.last_ms)
        return states


def _load_json(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > SNAPSHOT_BYTES_MAX:
        raise ValueError(f"{what} snapshot of {len(data)} bytes exceeds {SNAPSHOT_BYTES_MAX}")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what} snapshot is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what} snapshot is not a JSON object")
    return doc


def _int(value: object, low: int, high: int, what: str) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"snapshot: {what} must be an integer in {low}..{high}, got {value!r}")
    return value


def _parse_producer(row: object, recent: int) -> tuple[int, _Producer]:
    if not isinstance(row, list) or len(row) != 6:
        raise ValueError(f"producer state snapshot: bad producer entry {row!r:.80}")
    pid = _int(row[0], 0, PRODUCER_ID_MAX, "producer_id")
    epoch = _int(row[1], 0, EPOCH_MAX, "epoch")
    next_sequence = None if row[2] is None else _int(row[2], 0, SEQUENCE_MOD - 1, "next_sequence")
    last_ms = _int(row[3], -OFFSET_MAX, OFFSET_MAX, "last_ms")
    floor = None if row[4] is None else _int(row[4], 0, OFFSET_MAX, "floor_offset")
    if not isinstance(row[5], list):
        raise ValueError(f"producer state snapshot: producer {pid} batches are not a list")
    batches: deque[_Batch] = deque()
    for item in row[5]:
        if not isinstance(item, list) or len(item) != 3:
            raise ValueError(f"producer state snapshot: producer {pid} has a bad batch {item!r:.80}")
        seq = _int(item[0], 0, SEQUENCE_MOD - 1, "base_sequence")
        count = _int(item[1], 1, RECORD_COUNT_MAX, "record_count")
        offset = _int(item[2], 0, OFFSET_MAX, "base_offset")
        if (batches and offset <= batches[-1].base_offset) or (floor is not None and offset <= floor):
            raise ValueError(f"producer state snapshot: producer {pid} batches out of offset order")
        batches.append(_Batch(seq, count, offset))
    while len(batches) > recent:
        floor = batches.popleft().base_offset
    return pid, _Producer(epoch, next_sequence, last_ms, floor, batches)


class ProducerIdAllocator:
    """Hands out producer ids from a counter, and epochs for named (transactional) producers.

    ``allocate(None)`` gives a fresh id at epoch 0. ``allocate(name)`` gives the
    name's id with its epoch bumped by one, so that every partition the new
    instance writes to fences the old one; a new name gets a fresh id at epoch 0.
    When a name's epoch would pass the i16 maximum it gets a fresh id at epoch 0.

    Persist ``snapshot()`` (``atomic_write``) before handing an id out: an id or
    epoch given out twice after a crash would let two producers pass as one.
    At most ``names_max`` names are kept; beyond that the least recently
    allocated name is forgotten (its next instance gets a fresh id, and an old
    instance of it is no longer fenced).
    """

    def __init__(self, *, next_id: int = 0, names_max: int = 100_000) -> None:
        if not 0 <= next_id <= PRODUCER_ID_MAX + 1:
            raise ValueError(f"next_id must be 0..{PRODUCER_ID_MAX + 1}, got {next_id}")
        if names_max < 1:
            raise ValueError(f"names_max must be at least 1, got {names_max}")
        self.next_id = next_id
        self.names_max = names_max
        self._names: OrderedDict[str, tuple[int, int]] = OrderedDict()  # least recently allocated first

    def __len__(self) -> int:
        return len(self._names)

    def _fresh_id(self) -> int:
        if self.next_id > PRODUCER_ID_MAX:
            raise InternalError("producer ids exhausted")
        pid = self.next_id
        self.next_id += 1
        return pid

    def allocate(self, name: str | None = None) -> tuple[int, int]:
        """``(producer_id, epoch)`` for a new producer instance (named or not)."""
        if name is None:
            return self._fresh_id(), 0
        if not name or len(name.encode()) > NAME_BYTES_MAX:
            raise BadParameter(f"producer name must be 1..{NAME_BYTES_MAX} bytes of UTF-8")
        known = self._names.get(name)
        grant = (known[0], known[1] + 1) if known is not None and known[1] < EPOCH_MAX else (self._fresh_id(), 0)
        self._names[name] = grant
        self._names.move_to_end(name)
        while len(self._names) > self.names_max:
            self._names.popitem(last=False)
        return grant

    def snapshot(self) -> bytes:
        """``{"version": 1, "next_id": int, "names": [[name, producer_id, epoch], ...]}`` as JSON."""
        names = [[name, pid, epoch] for name, (pid, epoch) in self._names.items()]
        doc = {"version": SNAPSHOT_VERSION, "next_id": self.next_id, "names": names}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def restore(cls, data: bytes, *, names_max: int = 100_000) -> ProducerIdAllocator:
        """An allocator from ``snapshot()`` bytes; ``ValueError`` if they are not a valid snapshot."""
        doc = _load_json(data, "producer id")
        if doc.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"producer id snapshot version {doc.get('version')!r}, expected {SNAPSHOT_VERSION}")
        alloc = cls(next_id=_int(doc.get("next_id"), 0, PRODUCER_ID_MAX + 1, "next_id"), names_max=names_max)
        rows = doc.get("names")
        if not isinstance(rows, list):
            raise ValueError("producer id snapshot: 'names' is not a list")
        for row in rows[-names_max:]:
            if not isinstance(row, list) or len(row) != 3 or not isinstance(row[0], str) or not row[0]:
                raise ValueError(f"producer id snapshot: bad name entry {row!r:.80}")
            pid = _int(row[1], 0, alloc.next_id - 1, "producer_id")
            alloc._names[row[0]] = (pid, _int(row[2], 0, EPOCH_MAX, "epoch"))
        return alloc
