"""Slots and the consistent-hash ring of a key_shared group: which member owns which key.

Theory of operation
-------------------
*Slots.* A key hashes to one of ``SLOTS`` slots (:func:`slot_of`: the CRC-32 of the key
bytes through MurmurHash3's 32-bit finalizer, top 16 bits; stable across processes,
machines and versions, unlike Python's salted ``hash``). Keys that share a slot share
its order. A message without a key has no slot.

*Owners.* Each member puts ``virtual_points`` points on the ring 0..65535
(:func:`ring_points`, the same hash over the member id and the point's index); a slot
belongs to the member with the first point at or after it (wrapping around; equal
points rank by member id). A join takes, and a leave gives back, only that member's arcs.

:class:`Ring` holds the ``(point, member)`` pairs sorted, and the points alone for
``bisect``: an owner lookup is O(log points). A join or leave rebuilds both lists,
O(points). Pure arithmetic: no clock, no I/O.
"""

from __future__ import annotations

import zlib
from bisect import bisect_left

from fabric.errors import BadParameter

SLOTS = 65536


def mix32(h: int) -> int:
    """MurmurHash3's 32-bit finalizer: every input bit flips each output bit with probability ~1/2."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def slot_of(key: bytes | None) -> int | None:
    """The slot of a message key: ``mix32(crc32(key)) >> 16`` in 0..65535; None for no key."""
    if key is None:
        return None
    if not isinstance(key, bytes):
        raise BadParameter(f"a key must be bytes or None, got {type(key).__name__}")
    return mix32(zlib.crc32(key)) >> 16


def ring_points(member: str, virtual_points: int) -> list[int]:
    """The ring positions of a member: ``mix32(crc32(member_utf8 + index as 4 bytes big-endian)) >> 16``."""
    seed = zlib.crc32(member.encode("utf-8", "surrogatepass"))
    return [mix32(zlib.crc32(i.to_bytes(4, "big"), seed)) >> 16 for i in range(virtual_points)]


class Ring:
    """The members' points on the ring 0..65535, sorted; equal points rank by member id."""

    __slots__ = ("entries", "points", "virtual_points")

    def __init__(self, virtual_points: int) -> None:
        self.virtual_points = virtual_points
        self.entries: list[tuple[int, str]] = []  # (point, member), sorted
        self.points: list[int] = []  # the points of the ring, for bisect

    def owner(self, slot: int) -> str | None:
        """The member with the first point at or after ``slot``, wrapping around; None without members."""
        points = self.points
        if not points:
            return None
        i = bisect_left(points, slot)
        return self.entries[i if i < len(points) else 0][1]

    def join(self, member: str) -> None:
        self._set(sorted(self.entries + [(p, member) for p in ring_points(member, self.virtual_points)]))

    def leave(self, member: str) -> None:
        self._set([pm for pm in self.entries if pm[1] != member])

    def _set(self, entries: list[tuple[int, str]]) -> None:
        self.entries = entries
        self.points = [p for p, _ in entries]
