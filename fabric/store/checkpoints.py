"""Replication checkpoint files: the replicas' high watermarks and each partition's leader epochs.

Theory of operation
-------------------
Two small files let a restarted replica pick up where it was, both written atomically (temp
file, fsync, rename, fsync the directory: ``files.atomic_write``):

* ``replication-high-watermarks`` in the data directory (Kafka's
  replication-offset-checkpoint): every replica's high watermark on this node, one
  ``queue<TAB>queue id<TAB>partition<TAB>hw`` line each. The queue's id keeps a queue deleted
  and created again by the same name from inheriting its entry. The node writes it about once
  a second when one moved, without fsync, and with fsync at a stop: a stale (lower), empty or
  missing file is safe, since what consumers may see then starts lower and the leader's
  answers move it on. An unreadable line is skipped for the same reason. A partition's own
  ``high-watermark`` file, from builds before the shared file, is still read when the shared
  file does not name the partition.
* ``leader-epochs`` in a partition's directory: its leader-epoch cache, as the bytes the
  cluster layer's ``LeaderEpochCache`` encodes (this layer does not parse them). Written, fsynced,
  whenever the epochs change (rare: once per leadership change).
"""

from __future__ import annotations

import logging
from pathlib import Path

from fabric.errors import FabricError
from fabric.store.files import atomic_write

log = logging.getLogger("fabric.store.checkpoints")
EPOCH_FILE = "leader-epochs"
HW_FILE = "high-watermark"  # a partition's own checkpoint, before HW_CHECKPOINT: read when that lacks it
HW_CHECKPOINT = "replication-high-watermarks"

Key = tuple[str, int]


class HighWatermarkCheckpoint:
    """``HW_CHECKPOINT`` of one data directory: what it holds (``saved``) and writing it whole."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / HW_CHECKPOINT
        # partition -> (its queue's id, high watermark), as the file holds it (or is to)
        self.saved: dict[Key, tuple[str, int]] = self._read()
        self.unwritten = False  # the last write of the file failed (or a partition left it)

    def _read(self) -> dict[Key, tuple[str, int]]:
        """The file as it was left; an unreadable line is skipped (its partition falls back to a
        lower high watermark: safe)."""
        out: dict[Key, tuple[str, int]] = {}
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return out
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("%s is unreadable (%s): high watermarks start from the logs", self.path, exc)
            return out
        for line in text.splitlines():
            parts = line.split("\t")
            if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
                out[(parts[0], int(parts[2]))] = (parts[1], int(parts[3]))
        return out

    def get(self, key: Key, queue_id: str | None) -> int | None:
        """The saved high watermark of ``key`` if the entry is for this very queue (its id)."""
        saved = self.saved.get(key)
        if saved is not None and queue_id is not None and saved[0] == queue_id:
            return saved[1]
        return None

    def put(self, key: Key, queue_id: str, hw: int) -> None:
        """Record ``hw`` for the next ``write``."""
        self.saved[key] = (queue_id, hw)

    def drop(self, key: Key) -> None:
        """The partition left this node: its line goes at the next ``write``."""
        if self.saved.pop(key, None) is not None:
            self.unwritten = True

    def write(self, *, durable: bool) -> None:
        """Write every entry (fsynced if ``durable``). A failure is logged, not raised: the next
        write tries again, and an older file is safe meanwhile."""
        lines = [f"{q}\t{qid}\t{p}\t{hw}\n" for (q, p), (qid, hw) in self.saved.items()]
        try:
            atomic_write(self.path, "".join(lines).encode(), durable=durable)
            self.unwritten = False
        except FabricError as exc:
            self.unwritten = True
            log.warning("could not checkpoint the high watermarks in %s: %s", self.path, exc)


def read_partition_hw(directory: Path) -> int | None:
    """A partition's own ``high-watermark`` file of earlier builds (None: missing or unreadable)."""
    try:
        return int((directory / HW_FILE).read_bytes())
    except (FileNotFoundError, ValueError):
        return None


def read_leader_epochs(directory: Path) -> bytes | None:
    """The bytes of a partition's ``leader-epochs`` file (None: there is none)."""
    try:
        return (directory / EPOCH_FILE).read_bytes()
    except FileNotFoundError:
        return None


def write_leader_epochs(directory: Path, data: bytes) -> None:
    """Replace a partition's ``leader-epochs`` file, durably (raises DiskFull / StorageError)."""
    atomic_write(directory / EPOCH_FILE, data)
