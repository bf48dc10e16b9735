"""The leader-epoch cache of one partition replica: which leader epoch started at which offset.

Theory of operation
-------------------
Every record batch carries the leader epoch it was written in. A replica keeps, beside its log,
the list ``[(epoch, start_offset), ...]``: the first offset of each epoch present in its log,
epochs strictly increasing, start offsets non-decreasing. Two replicas whose logs hold a batch
with the same epoch at the same offset hold the same batch (one leader per epoch, and a leader
never rewrites its own log), so this list is enough to find where two logs part ways without
comparing their bytes.

``end_offset_for(epoch, log_end)`` answers the question of Kafka's KIP-279: "what is the end of
``epoch`` in your log?" It returns the largest epoch known here that is not newer than the one
asked for, and the offset where it ends (the start of the next epoch, or the log end for the
latest epoch). A follower whose last batch has epoch ``e`` and whose log ends at ``n`` has
diverged from its leader when the leader answers with an older epoch, or with an end before ``n``;
it then truncates to ``min(its own end of that epoch, the leader's end)``, never to its high
watermark (which may be ahead of, or behind, the real point of divergence).

``assign`` follows Kafka's ``LeaderEpochFileCache.assign``: a new epoch (or an earlier start for
the latest one) is recorded; entries that would break monotonicity (an epoch not older, or a start
not earlier, than the new entry) are dropped first. ``truncate_from_end`` follows a log truncation
(drop epochs that start at or after the new end); ``truncate_from_start`` follows deletion of old
segments (the epoch covering the new log start is kept, moved to start there).

The cache holds no file: ``encode``/``decode`` give the bytes of a small text checkpoint (version,
count, one ``epoch start_offset`` line per entry) that the store writes with temp file + fsync +
rename. ``decode`` rejects anything that is not exactly such a checkpoint with a ``ValueError``
naming the line and the problem.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

__all__ = ["UNDEFINED", "LeaderEpochCache"]

UNDEFINED = -1
"""Epoch and offset of an unknown answer (Kafka's UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET)."""

_VERSION = 0


class LeaderEpochCache:
    """``[(epoch, start_offset)]`` of one replica's log; see the module docstring."""

    __slots__ = ("_epochs", "_starts")

    def __init__(self, entries: Iterable[tuple[int, int]] = ()) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for epoch, start in entries:
            _check_entry(epoch, start)
            if self._epochs and epoch <= self._epochs[-1]:
                raise ValueError(f"leader epochs must increase: {epoch} after {self._epochs[-1]}")
            if self._starts and start < self._starts[-1]:
                raise ValueError(f"epoch start offsets must not decrease: {start} after {self._starts[-1]}")
            self._epochs.append(epoch)
            self._starts.append(start)

    # ---- reading

    @property
    def entries(self) -> list[tuple[int, int]]:
        """A copy of ``[(epoch, start_offset), ...]``, oldest first."""
        return list(zip(self._epochs, self._starts))

    def __len__(self) -> int:
        return len(self._epochs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LeaderEpochCache) and self.entries == other.entries

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.entries!r})"

    def latest_epoch(self) -> int:
        """The newest epoch, or -1 when the cache is empty."""
        return self._epochs[-1] if self._epochs else UNDEFINED

    def start_offset_for(self, epoch: int) -> int | None:
        """The start offset recorded for exactly ``epoch``, or None when it is not in the cache."""
        i = bisect_right(self._epochs, epoch) - 1
        if i >= 0 and self._epochs[i] == epoch:
            return self._starts[i]
        return None

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """``(e, end)``: ``e`` is the largest known epoch <= ``epoch`` and ``end`` where it ends here
        (the start of the next epoch, or ``log_end`` for the latest). ``epoch`` older than every
        entry gives ``(epoch, first start)``; newer than every entry, an empty cache or
        ``epoch == -1`` gives ``(-1, -1)``."""
        if epoch == UNDEFINED or not self._epochs:
            return (UNDEFINED, UNDEFINED)
        if epoch == self._epochs[-1]:
            return (epoch, log_end)
        i = bisect_right(self._epochs, epoch)  # index of the first entry newer than ``epoch``
        if i == len(self._epochs):
            return (UNDEFINED, UNDEFINED)  # newer than anything we know
        if i == 0:
            return (epoch, self._starts[0])
        return (self._epochs[i - 1], self._starts[i])

    # ---- changing

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True when the cache changed."""
        _check_entry(epoch, start_offset)
        if self._epochs and epoch == self._epochs[-1] and start_offset >= self._starts[-1]:
            return False
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """The log was cut to end at ``end_offset``: drop epochs starting at or after it."""
        changed = False
        while self._starts and self._starts[-1] >= end_offset:
            self._epochs.pop()
            self._starts.pop()
            changed = True
        return changed

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at ``start_offset``: drop epochs wholly before it; the epoch that
        covers it is kept and starts there."""
        i = bisect_right(self._starts, start_offset) - 1  # last entry starting at or before it
        if i < 0:
            return False
        changed = i > 0 or self._starts[i] != start_offset
        del self._epochs[:i]
        del self._starts[:i]
        self._starts[0] = start_offset
        return changed

    # ---- checkpoint bytes

    def encode(self) -> bytes:
        lines = [str(_VERSION), str(len(self._epochs))]
        lines += [f"{e} {s}" for e, s in zip(self._epochs, self._starts)]
        return ("\n".join(lines) + "\n").encode("ascii")

    @classmethod
    def decode(cls, data: bytes) -> LeaderEpochCache:
        """The cache of a checkpoint written by ``encode``; ValueError says what is wrong."""
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError as exc:
            raise ValueError(f"leader-epoch checkpoint is not ASCII text (byte {exc.start})") from None
        if not text.endswith("\n"):
            raise ValueError("leader-epoch checkpoint is truncated: it does not end with a newline")
        lines = text[:-1].split("\n")
        version = _int_line(lines, 0, "version")
        if version != _VERSION:
            raise ValueError(f"leader-epoch checkpoint line 1: version {version} is not supported (want {_VERSION})")
        count = _int_line(lines, 1, "entry count")
        if len(lines) - 2 != count:
            raise ValueError(f"leader-epoch checkpoint says {count} entries but holds {len(lines) - 2}")
        entries = []
        for n, line in enumerate(lines[2:], start=3):
            parts = line.split(" ")
            if len(parts) != 2 or not all(_is_uint(p) for p in parts):
                raise ValueError(f"leader-epoch checkpoint line {n}: expected '<epoch> <start_offset>', got {line!r}")
            entries.append((int(parts[0]), int(parts[1])))
        try:
            return cls(entries)
        except ValueError as exc:
            raise ValueError(f"leader-epoch checkpoint: {exc}") from None


def _check_entry(epoch: int, start: int) -> None:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"leader epoch must be an int >= 0, not {epoch!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"epoch start offset must be an int >= 0, not {start!r}")


def _is_uint(s: str) -> bool:
    return s.isascii() and s.isdigit() and (s == "0" or not s.startswith("0"))


def _int_line(lines: list[str], i: int, what: str) -> int:
    if i >= len(lines) or not _is_uint(lines[i]):
        got = repr(lines[i]) if i < len(lines) else "nothing"
        raise ValueError(f"leader-epoch checkpoint line {i + 1}: expected the {what}, got {got}")
    return int(lines[i])
