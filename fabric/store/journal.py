"""The metadata journal: small records appended to a file, so a change is kept at the cost of one
``write`` instead of a sqlite transaction on the node's event loop.

Theory of operation
-------------------
Committing a consumer group's offsets is the one metadata change that comes at the rate of the
data (a consumer may commit after every batch it handles). A sqlite transaction costs ~0.4 ms
here; on the event loop that is a stall for every producer and consumer of the node, and a
consumer committing per batch at 5,000 msg/s spent more time in commits than the node had. So
a commit is appended to this journal (page cache, ~10 us, the same durability as the sqlite
write it replaces: it survives the process, and the machine only after the OS writes it back)
and applied to the sqlite tables later, many commits in one transaction, by a background thread
(:class:`fabric.store.metadata.NodeMetadata`).

File format: a sequence of records, each ``u32 length | u32 crc32c(payload) | payload``, little
endian, payload a JSON array ``[key, value]`` (value ``null`` deletes the key). Replay stops at
the first record that is torn or fails its CRC (a crash mid-append); everything before it is kept.

Rotation: when the journal passes ``rotate_bytes`` the owner renames it to ``<name>.old``, opens
a new one, and hands the keys changed since the last rotation to its writer, which deletes
``.old`` once they are in sqlite. At open, ``.old`` and then the journal are replayed on top of
the tables (later records win), written to sqlite, and both files removed.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fabric.errors import DiskFull, StorageError
from fabric.protocol.batch import crc32c

log = logging.getLogger("fabric.store.journal")

RECORD = struct.Struct("<II")
RECORD_MAX = 16 << 20  # a record larger than this is damage, not data


def _error(exc: OSError, what: str) -> StorageError:
    if exc.errno == 28:  # ENOSPC
        return DiskFull(f"{what}: disk full")
    return StorageError(f"{what}: {exc.strerror or exc}")


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # one encoder: json.dumps with options makes one a call


def encode(key: str, value: Any) -> bytes:
    payload = _ENCODE([key, value]).encode()
    return RECORD.pack(len(payload), crc32c(payload)) + payload


def encode_offsets(key: str, offsets: dict[str, int]) -> bytes:
    """``encode(key, offsets)`` for a key of characters JSON keeps as they are (queue and group
    names are) and ``{partition: offset}`` with decimal partition keys: the same bytes, formatted
    directly (a committing consumer sends a COMMIT per poll)."""
    pairs = b",".join(b'"%s":%d' % (p.encode(), o) for p, o in offsets.items())
    payload = b'["%s",{%s}]' % (key.encode(), pairs)
    return RECORD.pack(len(payload), crc32c(payload)) + payload


def read_records(path: Path) -> Iterator[tuple[str, Any]]:
    """The records of a journal file up to the first torn or damaged one."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    pos = 0
    while pos + RECORD.size <= len(data):
        length, crc = RECORD.unpack_from(data, pos)
        start = pos + RECORD.size
        if length > RECORD_MAX or start + length > len(data):
            break
        payload = data[start : start + length]
        if crc32c(payload) != crc:
            break
        try:
            key, value = json.loads(payload)
        except (ValueError, TypeError):
            break
        if not isinstance(key, str):
            break
        yield key, value
        pos = start + length
    if pos != len(data):
        log.warning("journal %s: %d bytes after the last whole record ignored (a torn write)", path, len(data) - pos)


class Journal:
    """An append-only file of ``(key, value)`` records (the owner serialises calls)."""

    def __init__(self, path: Path, *, rotate_bytes: int = 1 << 20) -> None:
        self.path = path
        self.old_path = path.with_name(path.name + ".old")
        self.rotate_bytes = rotate_bytes
        self.size = 0
        self._fd = -1

    def open(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            self.size = os.fstat(self._fd).st_size
        except OSError as exc:
            raise _error(exc, f"opening {self.path}") from None

    def append(self, key: str, value: Any) -> None:
        """Write one record; raises DiskFull/StorageError (and then nothing of it counts)."""
        self.write(encode(key, value))

    def write(self, record: bytes) -> None:
        """Write one encoded record (``encode``, ``encode_offsets``); as ``append``."""
        try:
            n = os.write(self._fd, record)
        except OSError as exc:
            raise _error(exc, f"writing {self.path}") from None
        if n != len(record):  # a short write (disk full midway): cut it off so replay stays whole
            try:
                os.ftruncate(self._fd, self.size)
            except OSError:
                pass
            raise DiskFull(f"writing {self.path}: short write ({n} of {len(record)} bytes)")
        self.size += n

    @property
    def wants_rotation(self) -> bool:
        return self.size >= self.rotate_bytes and not self.old_path.exists()

    def rotate(self) -> None:
        """Move the current file aside as ``.old`` and start an empty one."""
        self.close()
        try:
            os.replace(self.path, self.old_path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _error(exc, f"rotating {self.path}") from None
        self.open()

    def replay(self) -> list[tuple[str, Any]]:
        """Every record of ``.old`` then of the journal, in order."""
        return [*read_records(self.old_path), *read_records(self.path)]

    def remove_all(self) -> None:
        """Delete both files (after their records are in sqlite)."""
        self.close()
        for p in (self.old_path, self.path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        self.size = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
