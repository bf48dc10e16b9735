"""Persistence of idempotent-producer state: where ``producers.py`` meets the disk.

Each partition keeps a ``producers.json`` snapshot in its directory, written
atomically (temp file, rename) when its log has rolled a segment since the last
one and, fsynced, at a clean close when it is far behind (``Store.save_producer_states``). On first use after a start the snapshot is loaded and the log
after the offset it covers is replayed, batch headers only, so a snapshot that a
crash left a second behind loses nothing. Producer ids come from one
``producer-ids.json`` allocator file in the data directory, saved before an id is
handed out.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fabric.protocol.batch import iter_batches
from fabric.store.files import atomic_write
from fabric.store.log import PartitionLog
from fabric.store.producers import ProducerIdAllocator, ProducerStates

log = logging.getLogger("fabric.store.idempotence")
SNAPSHOT = "producers.json"
ALLOCATOR = "producer-ids.json"
REPLAY_READ_BYTES = 8 << 20


def load_states(plog: PartitionLog, now_ms: int) -> ProducerStates:
    """The partition's producer state: its snapshot, then every batch header after it."""
    path = plog.directory / SNAPSHOT
    try:
        states = ProducerStates.restore(path.read_bytes())
    except FileNotFoundError:
        states = ProducerStates()
    except (OSError, ValueError) as exc:
        log.warning("producer snapshot %s unreadable (%s); rebuilding from the log", path, exc)
        states = ProducerStates()
    if states.end_offset > plog.next_offset:  # the log lost its tail (torn write cut off)
        states.truncate(plog.next_offset)
    offset = max(states.end_offset, plog.log_start_offset)
    while offset < plog.next_offset:
        data = plog.read(offset, REPLAY_READ_BYTES)
        if not data:
            break
        headers = [h for _, h in iter_batches(data, verify=False)]
        states.rebuild(headers, now_ms)
        offset = headers[-1].next_offset
    return states


def save_states(plog: PartitionLog, states: ProducerStates, *, durable: bool = True) -> None:
    atomic_write(plog.directory / SNAPSHOT, states.snapshot(), durable=durable)


class ProducerIds:
    """Hands out (producer id, epoch); the same name again bumps the epoch (fencing the old one)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / ALLOCATOR
        try:
            self.allocator = ProducerIdAllocator.restore(self.path.read_bytes())
        except FileNotFoundError:
            self.allocator = ProducerIdAllocator()

    def allocate(self, name: str | None) -> tuple[int, int]:
        pid, epoch = self.allocator.allocate(name)
        atomic_write(self.path, self.allocator.snapshot())  # durable before anyone uses it
        return pid, epoch
