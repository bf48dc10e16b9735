"""The file layer: names of segment files, atomic writes, directory fsync.

Only this package touches the disk, and the few primitives every other store
module needs live here: ``atomic_write`` (temp file, fsync, rename, fsync the
directory, as go-diskqueue writes its metadata), ``fsync_dir`` and the naming of
segment files after their base offset (``00000000000000001234.log``).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from fabric.errors import DiskFull, StorageError

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TEMP_SUFFIX = ".tmp"
BAD_SUFFIX = ".bad"
OFFSET_DIGITS = 20
OFFSET_MAX = 10**OFFSET_DIGITS - 1


def segment_path(directory: Path, base_offset: int, suffix: str) -> Path:
    """``directory/<20-digit base offset><suffix>``."""
    return directory / f"{base_offset:0{OFFSET_DIGITS}d}{suffix}"


def parse_segment_name(name: str, suffix: str = LOG_SUFFIX) -> int | None:
    """The base offset a segment file name stands for, or None if it is not one."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    if len(stem) != OFFSET_DIGITS or not stem.isdigit() or not stem.isascii():
        return None
    return int(stem)


def storage_error(exc: OSError, what: str) -> StorageError:
    """Translate an OSError at the boundary: ENOSPC/EDQUOT become DiskFull."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"disk full while {what}: {exc.strerror}")
    return StorageError(f"{what} failed: {exc.strerror or exc} (errno {exc.errno})")


def fsync_dir(directory: Path) -> None:
    """Make the creation, rename or removal of entries in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """``os.write`` until every byte is written (a short write is retried)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "write returned 0 bytes")
        view = view[n:]


def atomic_write(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new file, never a mix.

    Writes ``path.tmp``, fsyncs it, renames it over ``path`` and fsyncs the
    directory. Raises ``DiskFull`` or ``StorageError``; the temp file is removed
    on failure.
    """
    tmp = path.with_name(path.name + TEMP_SUFFIX)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise storage_error(exc, f"writing {path}") from None


def read_small_file(path: Path, limit_bytes: int) -> bytes | None:
    """The file's bytes if it exists and holds at most ``limit_bytes``, else None."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit_bytes + 1)
    except OSError:
        return None
    return data if len(data) <= limit_bytes else None


def unlink_quiet(path: Path) -> bool:
    """Remove a file; True if it was there."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def free_name(path: Path, suffix: str) -> Path:
    """``path + suffix``, or ``path.<n> + suffix`` when that already exists."""
    candidate = path.with_name(path.name + suffix)
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.{n}{suffix}")
        n += 1
    return candidate


def remove_tree(path: Path) -> None:
    """Remove a directory tree; a missing tree is not an error."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise storage_error(exc, f"removing {path}") from None
