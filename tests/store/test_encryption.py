"""Encryption at rest (issue 12, item 3): the sealed batch layout, the key file, and partition logs
and stores of encrypted queues (plaintext nowhere on disk, reads decrypt, recovery needs no key,
a missing key id refuses the partition and never truncates it)."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fabric.errors import BadParameter, ConfigError, CorruptBatch, MessageTooLarge, StorageError
from fabric.protocol.batch import (
    ENCRYPTED,
    check_batch,
    decode_records,
    encode_batch,
    iter_batches,
    parse_header,
    stamp,
)
from fabric.security import at_rest
from fabric.security.at_rest import (
    ENVELOPE_BYTES,
    AtRestKeys,
    MissingKey,
    NonceSource,
    init_key_file,
    list_key_file,
    open_all,
    open_sealed,
    read_key_file,
    rotate_key_file,
    seal,
)
from fabric.settings import QueueSettings, parse_config
from fabric.store.log import PartitionLog
from fabric.store.store import Store
from tests.store.helpers import SMALL, append, read_all

MARKER = b"SECRET-MARKER-7f3a"
ENC = dataclasses.replace(SMALL, encrypt=True)


def _batch(i: int = 0, *, ttl_ms: int = 0, keys: bool = False) -> bytearray:
    values = [MARKER + b"-%d-%d" % (i, j) for j in range(3)]
    return bytearray(
        encode_batch(
            values,
            keys=[b"k%d" % j for j in range(3)] if keys else None,
            headers=[{"h": MARKER}] * 3 if keys else None,
            timestamps=[1_000 + i] * 3,
            ttl_ms=ttl_ms,
        )
    )


def _files_hold(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "at-rest.keys"
    init_key_file(path, now_ms=1)
    return path


# ------------------------------------------------------------------ the pure layout


@pytest.mark.parametrize("ttl_ms", [0, 60_000])
@pytest.mark.parametrize("keys", [False, True])
def test_seal_then_open_gives_the_batch_back_byte_for_byte(ttl_ms: int, keys: bool) -> None:
    aead = AESGCM(AESGCM.generate_key(bit_length=256))
    plain = _batch(ttl_ms=ttl_ms, keys=keys)
    stamp(plain, 42, 3)
    h = parse_header(plain)
    stored = seal(plain, h, 7, aead, NonceSource().next())
    assert MARKER not in stored
    sh = check_batch(stored)  # the CRC covers the stored bytes: recovery checks it with no key
    assert sh.attributes == h.attributes | ENCRYPTED
    assert (sh.base_offset, sh.record_count, sh.max_timestamp) == (42, 3, h.max_timestamp)
    assert sh.size == h.size + ENVELOPE_BYTES
    assert at_rest.key_id_of(stored, 0, sh) == 7
    if ttl_ms:
        assert struct.unpack_from("<I", stored, 57)[0] == ttl_ms  # readable for expiry
    assert open_sealed(stored, 0, sh, lambda k: aead) == bytes(plain)
    with pytest.raises(CorruptBatch, match="encrypted at rest"):
        decode_records(stored)  # a client could never decode one by mistake


def test_a_changed_header_field_or_another_key_fails_authentication() -> None:
    aead = AESGCM(AESGCM.generate_key(bit_length=256))
    plain = _batch()
    stamp(plain, 10, 1)
    stored = bytearray(seal(plain, parse_header(plain), 1, aead, NonceSource().next()))
    moved = bytearray(stored)
    stamp(moved, 11, 1)  # the same batch claimed at another offset
    with pytest.raises(StorageError, match="fails authentication"):
        open_sealed(moved, 0, parse_header(moved), lambda k: aead)
    stamp(moved, 10, 9)  # the leader epoch is not authenticated: the store may stamp it
    stamp(plain, 10, 9)
    assert open_sealed(moved, 0, parse_header(moved), lambda k: aead) == bytes(plain)
    other = AESGCM(AESGCM.generate_key(bit_length=256))
    with pytest.raises(StorageError, match="key id 1"):
        open_sealed(stored, 0, parse_header(stored), lambda k: other)


def test_open_all_passes_plain_batches_through_and_nonces_never_repeat() -> None:
    aead = AESGCM(AESGCM.generate_key(bit_length=256))
    nonces = NonceSource()
    plain = [_batch(i) for i in range(3)]
    stored = [seal(b, parse_header(b), 1, aead, nonces.next()) if i != 1 else bytes(b) for i, b in enumerate(plain)]
    assert open_all(b"".join(stored), lambda k: aead) == b"".join(map(bytes, plain))
    assert len({nonces.next() for _ in range(10_000)}) == 10_000


def test_a_batch_too_large_once_sealed_is_refused() -> None:
    aead = AESGCM(AESGCM.generate_key(bit_length=256))
    plain = _batch()
    h = parse_header(plain)._replace(batch_length=64 * 1024 * 1024 - 12)
    with pytest.raises(MessageTooLarge, match="encrypted at rest"):
        seal(plain, h, 1, aead, NonceSource().next())


# ------------------------------------------------------------------ the key file


def test_key_file_is_private_rotates_and_lists_without_the_keys(tmp_path: Path, key_file: Path) -> None:
    assert key_file.stat().st_mode & 0o777 == 0o600
    with pytest.raises(BadParameter, match="exists already"):
        init_key_file(key_file, now_ms=2)
    first = read_key_file(key_file)[1]
    assert rotate_key_file(key_file, now_ms=3).key_id == 2
    assert key_file.stat().st_mode & 0o777 == 0o600
    keys = read_key_file(key_file)
    assert sorted(keys) == [1, 2] and keys[1].key == first.key  # old keys stay
    rows = list_key_file(key_file)
    assert [(r["id"], r["newest"]) for r in rows] == [(1, False), (2, True)]
    assert "key" not in rows[0] and rows[0]["fingerprint"] == first.fingerprint
    os.chmod(key_file, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        AtRestKeys(key_file)
    with pytest.raises(ConfigError, match="No such file"):
        AtRestKeys(tmp_path / "none")
    bad = tmp_path / "bad.keys"
    bad.write_text(json.dumps({"format": "fabric-at-rest-keys", "version": 1, "keys": []}))
    os.chmod(bad, 0o600)
    with pytest.raises(ConfigError, match="holds no key"):
        AtRestKeys(bad)


def test_config_needs_a_key_file_for_encrypted_queues() -> None:
    with pytest.raises(ConfigError, match="at_rest_key_file"):
        parse_config({"queue_defaults": {"encrypt": True}})
    with pytest.raises(ConfigError, match=r"\[queues.secret\] encrypt = true"):
        parse_config({"queues": {"secret": {"encrypt": True}}})
    config = parse_config({"security": {"at_rest_key_file": "k"}, "queues": {"secret": {"encrypt": True}}})
    assert config.security.at_rest_key_file == "k" and config.queues["secret"].encrypt
    with pytest.raises(BadParameter, match="'encrypt'"):
        QueueSettings.from_dict({"mode": "direct", "encrypt": True})


# ------------------------------------------------------------------ partition logs


def test_an_encrypted_log_keeps_no_plaintext_on_disk_and_reads_it_back(tmp_path: Path, key_file: Path) -> None:
    keys = AtRestKeys(key_file)
    log = PartitionLog.open(tmp_path / "q" / "0", ENC, now_ms=1_000, tail_cache_bytes=0, at_rest=keys)
    written = []
    for i in range(700):  # several segments of 64 KiB
        b = _batch(i, ttl_ms=5_000 if i % 2 else 0, keys=i % 3 == 0)
        append(log, b)
        written.append(bytes(b))
    assert log.segment_count > 2
    assert list(read_all(log)) == written  # no tail cache: every read decrypts
    assert log.read(0, 1 << 20)[: len(written[0])] == written[0]
    stored = log.read_stored(0, 1 << 20)
    assert all(h.attributes & ENCRYPTED for _, h in iter_batches(stored))
    log.close()
    assert _files_hold(tmp_path, MARKER) == []
    again = PartitionLog.open(tmp_path / "q" / "0", ENC, now_ms=2_000, at_rest=AtRestKeys(key_file))
    assert list(read_all(again)) == written
    again.close()


def test_tail_cache_serves_plaintext_and_a_replica_stores_its_leaders_bytes(tmp_path: Path, key_file: Path) -> None:
    keys = AtRestKeys(key_file)
    leader = PartitionLog.open(tmp_path / "l" / "0", ENC, now_ms=1_000, at_rest=keys)
    follower = PartitionLog.open(tmp_path / "f" / "0", ENC, now_ms=1_000, at_rest=keys)
    plain = [_batch(i) for i in range(5)]
    for b in plain:
        append(leader, b)
    assert leader.read(0, 1 << 20) == b"".join(map(bytes, plain))  # from the tail cache
    sealed = before = keys.sealed
    for _pos, h in iter_batches(leader.read_stored(0, 1 << 20)):
        raw = leader.read_stored(h.base_offset, 1)
        one = bytearray(raw[: h.size])
        follower.append(one, parse_header(one), now_ms=1_000, leader_epoch=h.leader_epoch)
    assert keys.sealed == sealed == before  # stored as they came: not sealed again
    assert follower.read_stored(0, 1 << 20) == leader.read_stored(0, 1 << 20)
    assert follower.read(0, 1 << 20) == b"".join(map(bytes, plain))
    leader.close()
    follower.close()


def test_recovery_truncates_a_torn_encrypted_tail_with_no_key(tmp_path: Path, key_file: Path) -> None:
    keys = AtRestKeys(key_file)
    d = tmp_path / "q" / "0"
    log = PartitionLog.open(d, ENC, now_ms=1_000, at_rest=keys)
    written = [bytes(b) for b in (_batch(i) for i in range(10)) if append(log, b) >= 0]
    log.close(clean=False)
    seg = sorted(d.glob("*.log"))[-1]
    with open(seg, "r+b") as f:
        f.truncate(seg.stat().st_size - 20)  # a torn last batch
    plain = PartitionLog.open(d, ENC, now_ms=2_000)  # recovery alone, no keys at all
    assert plain.next_offset == 27 and plain.recovery.bytes_truncated > 0
    plain.close()
    again = PartitionLog.open(d, ENC, now_ms=3_000, at_rest=AtRestKeys(key_file))
    assert list(read_all(again)) == written[:9]
    again.close()


def test_rotation_seals_new_batches_with_the_new_key_and_reads_both(tmp_path: Path, key_file: Path) -> None:
    keys = AtRestKeys(key_file)
    d = tmp_path / "q" / "0"
    log = PartitionLog.open(d, ENC, now_ms=1_000, tail_cache_bytes=0, at_rest=keys)
    first = [bytes(b) for b in (_batch(i) for i in range(3)) if append(log, b) >= 0]
    rotate_key_file(key_file, now_ms=2)
    later = [bytes(b) for b in (_batch(i) for i in range(3, 6)) if log.append(b, parse_header(b), now_ms=5_000) >= 0]
    assert keys.newest == 2  # picked up by the appending thread, no restart
    ids = [at_rest.key_id_of(s, p, h) for s in [log.read_stored(0, 1 << 20)] for p, h in iter_batches(s)]
    assert ids == [1, 1, 1, 2, 2, 2]
    assert list(read_all(log)) == first + later
    log.close()


def test_a_missing_key_id_refuses_the_partition_and_keeps_every_byte(tmp_path: Path, key_file: Path) -> None:
    d = tmp_path / "q" / "0"
    log = PartitionLog.open(d, ENC, now_ms=1_000, at_rest=AtRestKeys(key_file))
    for i in range(5):
        append(log, _batch(i))
    log.close()
    sizes = {p.name: p.stat().st_size for p in d.iterdir()}
    other = tmp_path / "other.keys"
    init_key_file(other, now_ms=1)  # a key file without this data's key... under the same id 1
    doc = json.loads(other.read_text())
    doc["keys"][0]["id"] = 2
    other.write_text(json.dumps(doc))
    refused = PartitionLog.open(d, ENC, now_ms=2_000, at_rest=AtRestKeys(other))
    assert refused.refused and "key id 1" in refused.refused and str(other) in refused.refused
    with pytest.raises(StorageError, match="key id 1"):
        refused.read(0, 1 << 20)
    with pytest.raises(StorageError, match="key id 1"):
        append(refused, _batch(9))
    refused.close()
    assert {p.name: p.stat().st_size for p in d.iterdir() if p.name in sizes} == sizes
    good = PartitionLog.open(d, ENC, now_ms=3_000, at_rest=AtRestKeys(key_file))
    assert good.refused is None and good.next_offset == 15 and len(list(read_all(good))) == 5
    good.close()


def test_a_key_missing_mid_log_is_refused_at_read_naming_it(tmp_path: Path, key_file: Path) -> None:
    keys = AtRestKeys(key_file)
    d = tmp_path / "q" / "0"
    log = PartitionLog.open(
        d, dataclasses.replace(ENC, segment_bytes=1 << 20), now_ms=1_000, tail_cache_bytes=0, at_rest=keys
    )
    append(log, _batch(0))
    rotate_key_file(key_file, now_ms=2)
    append(log, _batch(1), now_ms=5_000)
    rotate_key_file(key_file, now_ms=3)
    append(log, _batch(2), now_ms=9_000)
    keys._ciphers.pop(2)  # as if key 2 had been lost from the file after this node loaded it
    keys._entries.pop(2)
    keys._stamp = at_rest._stat_of(key_file)
    with pytest.raises(MissingKey, match="key id 2") as err:
        log.read(3, 1 << 20)
    assert err.value.key_id == 2 and err.value.code == StorageError.code
    log.close()


def test_store_refuses_an_encrypted_queue_without_keys_and_serves_it_with_them(tmp_path: Path, key_file: Path) -> None:
    plain_store = Store(tmp_path / "data", defaults=QueueSettings(), now_ms=0)
    with pytest.raises(BadParameter, match="at_rest_key_file"):
        plain_store.create_queue("secret", QueueSettings(encrypt=True), now_ms=0)
    plain_store.close()
    store = Store(tmp_path / "data", defaults=QueueSettings(), now_ms=0, at_rest=AtRestKeys(key_file))
    store.create_queue("secret", QueueSettings(encrypt=True, fsync="never"), now_ms=0)
    store.create_queue("open", QueueSettings(fsync="never"), now_ms=0)
    for name in ("secret", "open"):
        append(store.partition(name, 0), _batch())
    store.close()
    holding = _files_hold(tmp_path / "data", MARKER)
    assert holding and all("/open/" in str(p) for p in holding)
    blind = Store(tmp_path / "data", defaults=QueueSettings(), now_ms=0)  # the key file left out of the config
    assert blind.partition("secret", 0).refused and any("at_rest_key_file" in p for p in blind.problems)
    with pytest.raises(StorageError, match="at_rest_key_file"):
        blind.partition("secret", 0).read(0, 1 << 20)
    assert MARKER in blind.partition("open", 0).read(0, 1 << 20)
    blind.close()
    again = Store(tmp_path / "data", defaults=QueueSettings(), now_ms=0, at_rest=AtRestKeys(key_file))
    assert MARKER in again.partition("secret", 0).read(0, 1 << 20)
    again.close()
