"""Encryption at rest: record batches sealed with AES-256-GCM on their way to disk.

Theory of operation
-------------------
A queue with ``encrypt = true`` has every batch sealed by ``PartitionLog.append`` after the
store stamped its offsets, and opened again by ``PartitionLog.read`` (disk reads only: the
tail cache keeps the plaintext of recent batches, which never reaches the disk). The header
stays readable, so recovery, indexes, retention, idempotence and replication work on sealed
batches with no key; the CRC32C covers the stored bytes (ciphertext), so recovery checks and
truncates a torn tail without a key. A stored batch::

    [0, 57)        header: attributes |= ENCRYPTED (0x80), batch_length += ENVELOPE_BYTES,
                   crc = CRC32C of the stored bytes [21, end)
    [57, 61)       ttl_ms, only with HAS_TTL (readable: expiry reads it per batch)
    u16            key id (the key file's id of the key that sealed it)
    12 bytes       nonce
    n + 4 bytes    AES-GCM ciphertext of (u32 the producer's CRC32C | records region)
    16 bytes       GCM tag

The associated data is the stored header but for the two fields the store may write later
(``leader_epoch``, ``crc``): ``base_offset``, ``batch_length``, ``magic``, bytes [21, 57), the
ttl field and the key id. A batch moved to another offset, or with a changed count, timestamp,
producer field or attribute, fails authentication. Opening restores the batch byte for byte
(the producer's CRC comes back from inside the ciphertext), so consumers check the producer's
CRC end to end as before.

Nonces: 8 random bytes drawn per process (and again every 2**32 batches) followed by a u32
counter (``NonceSource``). Within a process a nonce never repeats; across processes, nodes and
restarts that share a key a repeat needs two 64-bit random draws to collide (with a million
draws, about 2**-25). Random 96-bit nonces would reach that risk after about 2**40 batches, and
offset-derived ones repeat outright when a torn tail or a diverging replica is truncated and
the same offset is written again with other records.

Keys live in one JSON file (``fabric auth at-rest-key init|rotate|list FILE``), mode 0600,
every key ever used kept with its id; the newest encrypts. A node re-reads the file when it
changes (looked at once a second by the appending thread, at once when it meets a key id it
does not hold), so a rotation needs no restart. A batch whose key id is not in the file is
never served: reads fail with ``StorageError`` naming the key id, and a partition whose
segments start or end with such a batch is refused at open (``PartitionLog.refused``).

Everything but ``AtRestKeys``' file handling is pure: bytes in, bytes out.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fabric.errors import BadParameter, ConfigError, CorruptBatch, MessageTooLarge, StorageError
from fabric.protocol.batch import (
    BATCH_BYTES_MAX,
    CRC_START,
    ENCRYPTED,
    HAS_TTL,
    HEADER_SIZE,
    LENGTH_PREFIX,
    BatchHeader,
    crc32c,
    parse_header,
)

log = logging.getLogger("fabric.security.at_rest")

ALGORITHM = "AES-256-GCM"
KEY_BYTES = 32
KEY_ID_MAX = 0xFFFF
NONCE_BYTES = 12
TAG_BYTES = 16
ENVELOPE_BYTES = 2 + NONCE_BYTES + 4 + TAG_BYTES  # key id, nonce, the producer's CRC, tag: 34
FILE_FORMAT = "fabric-at-rest-keys"
FILE_VERSION = 1
FILE_BYTES_MAX = 4 * 1024 * 1024
RELOAD_CHECK_MS = 1000

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_CRC = struct.Struct("<I")
_ATTRIBUTES = struct.Struct("<H")
_BATCH_LENGTH = struct.Struct("<i")


class MissingKey(StorageError):
    """A stored batch names a key id the key file does not hold: never served, never truncated."""

    def __init__(self, key_id: int, message: str) -> None:
        super().__init__(message)
        self.key_id = key_id


# ---------------------------------------------------------------------------- pure layout


def _prefix_len(h: BatchHeader) -> int:
    """Bytes that stay readable: the header, and ttl_ms when the batch has one."""
    return HEADER_SIZE + 4 if h.attributes & HAS_TTL else HEADER_SIZE


def _aad(head: bytes | bytearray | memoryview, prefix: int, key_id: bytes | memoryview) -> bytes:
    """Associated data: the stored header but for ``leader_epoch`` [12, 16) and ``crc`` [17, 21)."""
    return bytes(head[0:12]) + bytes(head[16:17]) + bytes(head[CRC_START:prefix]) + bytes(key_id)


def seal(batch: bytes | bytearray | memoryview, h: BatchHeader, key_id: int, aead: AESGCM, nonce: bytes) -> bytes:
    """The stored form of one whole, stamped, plaintext batch (``h`` its header)."""
    prefix = _prefix_len(h)
    size = h.batch_length + LENGTH_PREFIX + ENVELOPE_BYTES
    if size > BATCH_BYTES_MAX:
        raise MessageTooLarge(
            f"batch of {size - ENVELOPE_BYTES} bytes: encrypted at rest it would exceed {BATCH_BYTES_MAX} bytes"
        )
    head = bytearray(batch[:prefix])
    _BATCH_LENGTH.pack_into(head, 8, size - LENGTH_PREFIX)
    _ATTRIBUTES.pack_into(head, CRC_START, h.attributes | ENCRYPTED)
    kid = _U16.pack(key_id)
    plain = _CRC.pack(h.crc) + bytes(batch[prefix : h.batch_length + LENGTH_PREFIX])
    covered = bytes(head[CRC_START:]) + kid + nonce + aead.encrypt(nonce, plain, _aad(head, prefix, kid))
    _CRC.pack_into(head, 17, crc32c(covered))
    return bytes(head[:CRC_START]) + covered


def key_id_of(buf: bytes | bytearray | memoryview, pos: int, h: BatchHeader) -> int | None:
    """The key id of a stored batch at ``pos``; None when it is not encrypted."""
    if not h.attributes & ENCRYPTED:
        return None
    at = pos + _prefix_len(h)
    if h.batch_length + LENGTH_PREFIX < at - pos + ENVELOPE_BYTES or len(buf) < at + 2:
        raise CorruptBatch(f"encrypted batch at offset {h.base_offset} is shorter than its envelope")
    return int(_U16.unpack_from(buf, at)[0])


def open_sealed(
    buf: bytes | bytearray | memoryview, pos: int, h: BatchHeader, cipher: Callable[[int], AESGCM]
) -> bytes:
    """The plaintext batch a stored one at ``pos`` was sealed from, byte for byte.

    ``cipher(key_id)`` gives the key (or raises ``MissingKey``). A batch that fails
    authentication raises ``StorageError``: nothing undecryptable is ever returned."""
    key_id = key_id_of(buf, pos, h)
    assert key_id is not None
    prefix = _prefix_len(h)
    end = pos + h.batch_length + LENGTH_PREFIX
    at = pos + prefix
    view = memoryview(buf)
    head = view[pos:at]
    nonce = bytes(view[at + 2 : at + 2 + NONCE_BYTES])
    try:
        plain = cipher(key_id).decrypt(
            nonce, bytes(view[at + 2 + NONCE_BYTES : end]), _aad(head, prefix, view[at : at + 2])
        )
    except InvalidTag:
        raise StorageError(
            f"batch at offset {h.base_offset} fails authentication with at-rest key id {key_id}: "
            "the key in the key file is not the one that sealed it, or the stored bytes were changed"
        ) from None
    out = bytearray(head)
    _BATCH_LENGTH.pack_into(out, 8, h.batch_length - ENVELOPE_BYTES)
    _ATTRIBUTES.pack_into(out, CRC_START, h.attributes & ~ENCRYPTED)
    out[17:21] = plain[:4]
    out += memoryview(plain)[4:]
    return bytes(out)


class OpenedBatches:
    """Recently opened batches of one partition by base offset, up to ``capacity_bytes``
    (oldest out first): a reader that comes back to the same batches (a consumer whose push
    read reaches past what is visible yet) does not decrypt them again. Cleared when the log
    is truncated (an offset may then hold other records)."""

    __slots__ = ("_batches", "capacity_bytes", "size_bytes")

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._batches: dict[int, bytes] = {}

    def get(self, base_offset: int) -> bytes | None:
        return self._batches.get(base_offset)

    def put(self, base_offset: int, plain: bytes) -> None:
        if len(plain) > self.capacity_bytes:
            return
        self._batches[base_offset] = plain
        self.size_bytes += len(plain)
        batches = self._batches
        while self.size_bytes > self.capacity_bytes:
            self.size_bytes -= len(batches.pop(next(iter(batches))))

    def clear(self) -> None:
        self._batches.clear()
        self.size_bytes = 0


def open_all(
    data: bytes | bytearray | memoryview, cipher: Callable[[int], AESGCM], opened: OpenedBatches | None = None
) -> bytes:
    """Whole batches laid end to end (a segment read), each encrypted one opened (or taken from
    ``opened``, where it is remembered)."""
    parts: list[bytes | memoryview] = []
    view = memoryview(data)
    pos, end = 0, len(data)
    while pos < end:
        h = parse_header(data, pos)
        size = h.batch_length + LENGTH_PREFIX
        if not h.attributes & ENCRYPTED:
            parts.append(view[pos : pos + size])
        else:
            plain = opened.get(h.base_offset) if opened is not None else None
            if plain is None:
                plain = open_sealed(data, pos, h, cipher)
                if opened is not None:
                    opened.put(h.base_offset, plain)
            parts.append(plain)
        pos += size
    return b"".join(parts) if len(parts) != 1 else bytes(parts[0])


class NonceSource:
    """96-bit nonces: 8 random bytes (drawn again every 2**32 nonces) then a u32 counter.

    Thread-safe; never hands out the same nonce twice in one process."""

    __slots__ = ("_counter", "_lock", "_salt")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._salt = os.urandom(8)
        self._counter = itertools.count()

    def next(self) -> bytes:
        with self._lock:
            n = next(self._counter)
            if n > 0xFFFFFFFF:
                self._salt, self._counter = os.urandom(8), itertools.count(1)
                n = 0
            return self._salt + _U32.pack(n)


# ---------------------------------------------------------------------------- the key file


@dataclass(frozen=True, slots=True)
class KeyEntry:
    key_id: int
    key: bytes
    created_ms: int

    @property
    def fingerprint(self) -> str:
        """First 16 hex digits of SHA-256 of the key: tells keys apart without showing them."""
        return hashlib.sha256(self.key).hexdigest()[:16]


def _parse(raw: bytes, path: Path) -> dict[int, KeyEntry]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"at-rest key file {path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT or doc.get("version") != FILE_VERSION:
        raise ConfigError(f"at-rest key file {path}: not a {FILE_FORMAT} file of version {FILE_VERSION}")
    entries: dict[int, KeyEntry] = {}
    for item in doc.get("keys", []):
        try:
            key_id, algorithm = item["id"], item["algorithm"]
            key = base64.b64decode(item["key"], validate=True)
            created = item.get("created_ms", 0)
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"at-rest key file {path}: a key entry needs id, algorithm and key (base64)") from None
        if type(key_id) is not int or not 1 <= key_id <= KEY_ID_MAX or key_id in entries:
            raise ConfigError(f"at-rest key file {path}: key id {key_id!r} must be a unique integer 1..{KEY_ID_MAX}")
        if algorithm != ALGORITHM or len(key) != KEY_BYTES:
            raise ConfigError(
                f"at-rest key file {path}: key id {key_id} must be {ALGORITHM} with a {KEY_BYTES}-byte key"
            )
        entries[key_id] = KeyEntry(key_id, key, created if type(created) is int else 0)
    if not entries:
        raise ConfigError(f"at-rest key file {path} holds no key: `fabric auth at-rest-key init {path}`")
    return entries


def _encode(entries: Iterable[KeyEntry]) -> bytes:
    keys = [
        {"id": e.key_id, "algorithm": ALGORITHM, "key": base64.b64encode(e.key).decode(), "created_ms": e.created_ms}
        for e in sorted(entries, key=lambda e: e.key_id)
    ]
    doc = {"format": FILE_FORMAT, "version": FILE_VERSION, "keys": keys}
    return (json.dumps(doc, indent=2) + "\n").encode()


def _stat_of(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_ino, st.st_size


def read_key_file(path: str | Path) -> dict[int, KeyEntry]:
    """The keys of ``path``; ``ConfigError`` naming the file when it is missing, readable by
    others than its owner (mode must be 0600 or stricter), or malformed."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as exc:
        raise ConfigError(f"at-rest key file {p}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode & 0o777
        if mode & 0o077:
            raise ConfigError(
                f"at-rest key file {p} has mode {mode:04o}: others than its owner may read it; `chmod 600 {p}`"
            )
        raw = os.read(fd, FILE_BYTES_MAX + 1)
    finally:
        os.close(fd)
    if len(raw) > FILE_BYTES_MAX:
        raise ConfigError(f"at-rest key file {p} is larger than {FILE_BYTES_MAX} bytes")
    return _parse(raw, p)


def _write_private(path: Path, data: bytes, *, replace: bool) -> None:
    """Write ``data`` with mode 0600: a new file (never over an existing one unless ``replace``:
    then through a temp file, fsynced and renamed, so a crash leaves the old or the new file)."""
    target = path if not replace else path.with_name(path.name + ".tmp")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL)
    try:
        fd = os.open(target, flags, 0o600)
    except FileExistsError:
        raise BadParameter(f"{path} exists already; `fabric auth at-rest-key rotate {path}` adds a key") from None
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if replace:
        os.replace(target, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def init_key_file(path: str | Path, now_ms: int) -> KeyEntry:
    """Create ``path`` (0600) holding one new key, id 1."""
    p = Path(path)
    entry = KeyEntry(1, AESGCM.generate_key(bit_length=256), now_ms)
    _write_private(p, _encode([entry]), replace=False)
    return entry


def rotate_key_file(path: str | Path, now_ms: int) -> KeyEntry:
    """Add a new key (the highest id + 1) to ``path``; every older key stays, for the data it sealed."""
    p = Path(path)
    entries = read_key_file(p)
    newest = max(entries)
    if newest >= KEY_ID_MAX:
        raise BadParameter(f"{p} holds key id {KEY_ID_MAX}, the last one")
    entry = KeyEntry(newest + 1, AESGCM.generate_key(bit_length=256), now_ms)
    _write_private(p, _encode([*entries.values(), entry]), replace=True)
    return entry


def list_key_file(path: str | Path) -> list[dict[str, Any]]:
    """One row per key, oldest first: id, algorithm, created_ms, fingerprint, newest (never the key)."""
    entries = read_key_file(path)
    newest = max(entries)
    return [
        {
            "id": e.key_id,
            "algorithm": ALGORITHM,
            "created_ms": e.created_ms,
            "fingerprint": e.fingerprint,
            "newest": e.key_id == newest,
        }
        for e in sorted(entries.values(), key=lambda e: e.key_id)
    ]


class AtRestKeys:
    """A node's at-rest keys, from its ``[security] at_rest_key_file``.

    Used by the thread that appends and reads partition logs (the node's event loop)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._entries = read_key_file(self.path)  # ConfigError naming the file first
        self._stamp = _stat_of(self.path)
        self._ciphers = {k: AESGCM(e.key) for k, e in self._entries.items()}
        self.newest = max(self._entries)
        self._newest_cipher = self._ciphers[self.newest]
        self._nonces = NonceSource()
        self._next_check_ms = 0
        self.sealed = 0  # batches sealed and opened (for tests and metrics)
        self.opened = 0

    @property
    def key_ids(self) -> list[int]:
        return sorted(self._entries)

    # ------------------------------------------------------------------ reload

    def maybe_reload(self, now_ms: int) -> None:
        """Re-read the file if it changed, looking at most once per RELOAD_CHECK_MS."""
        if now_ms < self._next_check_ms:
            return
        self._next_check_ms = now_ms + RELOAD_CHECK_MS
        self.reload()

    def reload(self) -> bool:
        """Take in keys added to the file since; True if any was. A key missing from the file now,
        or changed under its id, is kept as it was loaded (logged): data sealed with it stays readable."""
        try:
            stamp = _stat_of(self.path)
            if stamp == self._stamp:
                return False
            entries = read_key_file(self.path)
        except (OSError, ConfigError) as exc:
            log.error("at-rest key file %s could not be re-read (%s); keeping the keys loaded", self.path, exc)
            return False
        self._stamp = stamp
        added = False
        for key_id, entry in entries.items():
            known = self._entries.get(key_id)
            if known is None:
                self._entries[key_id] = entry
                self._ciphers[key_id] = AESGCM(entry.key)
                added = True
            elif known.key != entry.key:
                log.error("at-rest key file %s: key id %d changed; keeping the key loaded before", self.path, key_id)
        gone = set(self._entries) - set(entries)
        if gone:
            log.error("at-rest key file %s lost key id(s) %s; keeping them as loaded", self.path, sorted(gone))
        newest = max(self._entries)
        if newest != self.newest:
            log.info("at-rest key id %d encrypts new batches from now on (was %d)", newest, self.newest)
            self.newest, self._newest_cipher = newest, self._ciphers[newest]
        return added

    # ---------------------------------------------------------- seal and open

    def seal(self, batch: bytes | bytearray, h: BatchHeader, now_ms: int) -> bytes:
        """``batch`` (whole, stamped, plaintext) sealed with the newest key."""
        if now_ms >= self._next_check_ms:
            self.maybe_reload(now_ms)
        self.sealed += 1
        return seal(batch, h, self.newest, self._newest_cipher, self._nonces.next())

    def cipher(self, key_id: int) -> AESGCM:
        """The key of ``key_id``; if the file does not hold it, the file is read again once."""
        found = self._ciphers.get(key_id)
        if found is None and self.reload():
            found = self._ciphers.get(key_id)
        if found is None:
            raise MissingKey(key_id, self.missing_message([key_id]))
        return found

    def open_all(self, data: bytes | bytearray | memoryview, opened: OpenedBatches | None = None) -> bytes:
        """Stored batches laid end to end -> the plaintext batches (``MissingKey`` /
        ``StorageError`` rather than anything undecryptable)."""
        out = open_all(data, self.cipher, opened)
        self.opened += 1
        return out

    def missing(self, key_ids: Iterable[int]) -> list[int]:
        """Which of ``key_ids`` the file does not hold (read again once if any)."""
        wanted = set(key_ids)
        if wanted - set(self._ciphers):
            self.reload()
        return sorted(wanted - set(self._ciphers))

    def missing_message(self, key_ids: list[int]) -> str:
        ids = ", ".join(str(k) for k in key_ids)
        return (
            f"at-rest key id {ids} is not in {self.path} (it holds {', '.join(map(str, self.key_ids))}): "
            "batches were encrypted with it; put the key file that holds it back (every key ever used "
            "must stay in the file) and restart the node"
        )
