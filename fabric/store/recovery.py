"""Loading a partition directory at open: trust what can be trusted, check the rest, report.

Theory of operation
-------------------
Like Kafka's ``LogLoader``, recovery works segment by segment, oldest first:

* Stray files go: ``*.tmp`` left by an interrupted ``atomic_write``, and index
  files whose segment is gone. ``*.bad`` files stay for a human to look at.
* A *sealed* segment (every one but the last) was fsynced with its indexes at
  roll. Its indexes are trusted if they load sanely (size a multiple of the entry
  size, strictly increasing, last position inside the file); then only the batches
  from the last index entry to the end of the file are read and CRC-checked,
  which also yields the segment's next offset and newest timestamp. A segment
  whose indexes are missing or insane, or whose tail does not check out, is
  scanned whole and its indexes rebuilt.
* The *active* (last) segment may have been cut short by a crash, so it is
  scanned whole, CRC by CRC, unless a clean-shutdown marker written at close
  names it with its exact size and next offset: then it is treated like a
  sealed one. The marker is removed at open, before any append.
* A scan stops at the first batch that is cut short, malformed, out of offset
  order or fails its CRC; the file is truncated there and the bytes dropped are
  reported. The good prefix always survives. A non-empty segment with no good
  batch at all (or that cannot be read) is renamed ``.bad`` rather than deleted.
* A segment that overlaps the one before it is set aside the same way.

Offsets after a truncated sealed segment are left as a gap: readers skip to the
next batch that exists. Everything done is counted in a ``RecoveryReport``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from fabric.errors import StorageError
from fabric.settings import QueueSettings
from fabric.store.files import (
    BAD_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TEMP_SUFFIX,
    TIME_INDEX_SUFFIX,
    atomic_write,
    free_name,
    fsync_dir,
    parse_segment_name,
    read_small_file,
    unlink_quiet,
)
from fabric.store.index import OffsetIndex, TimeIndex
from fabric.store.segment import Segment, SegmentDamage

log = logging.getLogger("fabric.store.recovery")

CLEAN_MARKER = "clean-shutdown.json"
MARKER_BYTES_MAX = 4096
MARKER_VERSION = 1


@dataclass(slots=True)
class RecoveryReport:
    """What opening a partition found and did."""

    segments: int = 0  # segments loaded
    segments_scanned: int = 0  # segments read whole with CRC checks
    batches_checked: int = 0  # batches whose CRC was verified
    bytes_truncated: int = 0  # bytes cut off damaged or torn segment tails
    indexes_rebuilt: int = 0  # segments whose indexes were rebuilt by a scan
    clean_shutdown: bool = False  # a valid clean-shutdown marker let the active segment skip its scan
    duration_ms: int = 0
    bad_segments: list[str] = field(default_factory=list)  # files renamed *.bad by this open
    problems: list[str] = field(default_factory=list)  # one line per damage found

    @property
    def lossless(self) -> bool:
        return not self.bytes_truncated and not self.bad_segments

    def to_dict(self) -> dict[str, object]:
        return {
            "segments": self.segments,
            "segments_scanned": self.segments_scanned,
            "batches_checked": self.batches_checked,
            "bytes_truncated": self.bytes_truncated,
            "indexes_rebuilt": self.indexes_rebuilt,
            "clean_shutdown": self.clean_shutdown,
            "duration_ms": self.duration_ms,
            "bad_segments": list(self.bad_segments),
            "problems": list(self.problems),
        }


# ------------------------------------------------------------ clean marker


def write_clean_marker(directory: Path, active: Segment) -> None:
    """Record the active segment's exact state; only call after its data and indexes are fsynced."""
    record = {
        "version": MARKER_VERSION,
        "segment": active.base_offset,
        "size": active.size,
        "next_offset": active.next_offset,
        "created_ms": active.created_ms,
    }
    atomic_write(directory / CLEAN_MARKER, json.dumps(record).encode())


def take_clean_marker(directory: Path) -> dict[str, int] | None:
    """Read and remove the clean-shutdown marker; None if absent or malformed."""
    path = directory / CLEAN_MARKER
    raw = read_small_file(path, MARKER_BYTES_MAX)
    if raw is None:
        return None
    if unlink_quiet(path):
        fsync_dir(directory)
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    keys = ("version", "segment", "size", "next_offset", "created_ms")
    if not isinstance(record, dict) or any(type(record.get(k)) is not int for k in keys):
        return None
    if record["version"] != MARKER_VERSION or min(record[k] for k in keys) < 0:
        return None
    return {k: record[k] for k in keys}


# ----------------------------------------------------------------- loading


def _sweep(directory: Path) -> list[int]:
    """Remove temp files and orphaned indexes; return the segments' base offsets, sorted."""
    bases: set[int] = set()
    indexes: list[tuple[int, str]] = []
    for entry in os.scandir(directory):
        name = entry.name
        if name.endswith(TEMP_SUFFIX):
            unlink_quiet(directory / name)
            continue
        base = parse_segment_name(name, LOG_SUFFIX)
        if base is not None:
            bases.add(base)
            continue
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            base = parse_segment_name(name, suffix)
            if base is not None:
                indexes.append((base, name))
    for base, name in indexes:
        if base not in bases:
            unlink_quiet(directory / name)
    return sorted(bases)


def set_aside(seg: Segment, report: RecoveryReport, reason: str) -> None:
    """Rename a segment beyond repair to ``*.bad`` (never delete data we do not understand)."""
    seg.close()
    target = free_name(seg.path, BAD_SUFFIX)
    try:
        os.replace(seg.path, target)
    except OSError as exc:
        raise StorageError(f"cannot set aside damaged segment {seg.path}: {exc.strerror}") from None
    unlink_quiet(seg.offset_index.path)
    unlink_quiet(seg.time_index.path)
    fsync_dir(seg.directory)
    report.bad_segments.append(target.name)
    report.problems.append(f"{seg.path.name}: {reason}; renamed {target.name}")
    log.error("partition %s: segment %s %s; renamed %s", seg.directory, seg.path.name, reason, target.name)


def _trust_indexes(seg: Segment, file_size: int, report: RecoveryReport) -> bool:
    """Load the segment's indexes and check its tail; False if it must be scanned."""
    offset_index = OffsetIndex.load(seg.offset_index.path, file_size)
    time_index = TimeIndex.load(seg.time_index.path)
    if offset_index is None or time_index is None:
        return False
    seg.offset_index, seg.time_index = offset_index, time_index
    try:
        report.batches_checked += seg.resume_from_index(file_size)
    except (SegmentDamage, OSError) as exc:
        report.problems.append(f"{seg.path.name}: indexes or tail do not check out ({exc}); rescanning")
        return False
    return True


def _scan_and_repair(seg: Segment, file_size: int, report: RecoveryReport) -> bool:
    """Scan the whole segment, truncate at the first damage, rewrite its indexes.

    Returns False if the segment was set aside as ``.bad``.
    """
    result = seg.scan(verify=True, end=file_size)
    report.segments_scanned += 1
    report.batches_checked += result.batches
    report.indexes_rebuilt += 1
    damage = result.damage
    if damage is not None:
        if result.batches == 0 and not damage.torn:
            set_aside(seg, report, f"holds no good batch ({damage.reason} at byte {damage.position})")
            return False
        dropped = file_size - seg.size
        try:
            os.truncate(seg.path, seg.size)
            fd = os.open(seg.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            set_aside(seg, report, f"cannot be truncated after damage ({exc.strerror})")
            return False
        report.bytes_truncated += dropped
        report.problems.append(f"{damage}; truncated {dropped} bytes")
        log.warning("partition %s: %s; truncated %d bytes", seg.directory, damage, dropped)
    seg.flush_indexes(durable=True)
    return True


def _load_segment(
    directory: Path,
    base: int,
    settings: QueueSettings,
    *,
    active: bool,
    marker: dict[str, int] | None,
    now_ms: int,
    report: RecoveryReport,
) -> Segment | None:
    seg = Segment(directory, base, index_interval=settings.index_interval_bytes, created_ms=now_ms)
    try:
        seg.open_file(writable=active)
        file_size = seg.file_size()
    except (StorageError, OSError) as exc:
        set_aside(seg, report, f"cannot be opened ({exc})")
        return None
    clean = marker if marker and marker["segment"] == base and marker["size"] == file_size else None
    if (not active or clean) and _trust_indexes(seg, file_size, report):
        if clean is None:
            seg.sealed = not active
            return seg
        if seg.next_offset == clean["next_offset"]:
            report.clean_shutdown = True
            seg.created_ms = min(clean["created_ms"], now_ms)
            return seg
        report.problems.append(f"{seg.path.name}: clean-shutdown marker disagrees with the segment; rescanning")
    if not _scan_and_repair(seg, file_size, report):
        return None
    seg.sealed = not active
    return seg


def load_segments(directory: Path, settings: QueueSettings, *, now_ms: int) -> tuple[list[Segment], RecoveryReport]:
    """Open every segment in ``directory`` (creating the first when there is none), recovering as needed."""
    started = time.perf_counter()
    report = RecoveryReport()
    marker = take_clean_marker(directory)
    bases = _sweep(directory)
    segments: list[Segment] = []
    resume_at = 0  # where a new active segment starts if the last one is lost
    try:
        for i, base in enumerate(bases):
            active = i == len(bases) - 1
            seg = _load_segment(directory, base, settings, active=active, marker=marker, now_ms=now_ms, report=report)
            resume_at = max(resume_at, base)
            if seg is None:
                continue
            if segments and seg.base_offset < segments[-1].next_offset:
                if seg.size == 0:
                    seg.delete()
                else:
                    set_aside(seg, report, f"overlaps the segment before it (ends at {segments[-1].next_offset})")
                continue
            segments.append(seg)
        if not segments or segments[-1].sealed:  # no segment yet, or the last one was set aside
            start = max(resume_at, segments[-1].next_offset if segments else 0)
            segments.append(
                Segment.create(directory, start, index_interval=settings.index_interval_bytes, now_ms=now_ms)
            )
            fsync_dir(directory)
    except BaseException:
        for seg in segments:
            seg.close()
        raise
    report.segments = len(segments)
    report.duration_ms = int((time.perf_counter() - started) * 1000)
    return segments, report
