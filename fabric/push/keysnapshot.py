"""Restarts of a key_shared lease table: what its snapshot keeps, and how it is read back.

Theory of operation
-------------------
A snapshot keeps the floor, the settled offsets above it and the receive counts of
delivered, unsettled offsets; not keys, leases or new offsets. A restored table has no
members and ``offered_upto == floor``: the caller offers again from there, and each
offset comes back settled, released with its receive count (ready at once, or dead),
or new. Settling offsets not offered yet (a purge) keeps them as settled spans;
``offered_upto`` jumps over a span that starts at it, so the caller, which reads from
``offered_upto`` for every offer, never reads them (an offer may still carry some
inside a batch: they stay settled).

The snapshot is a JSON-able dict, held as ranges whatever the number of offsets::

    {"version": 1, "kind": "key_shared", "floor": F,
     "settled": [[start, end], ...],               above F, ascending, disjoint
     "counts": [[start, end, receive_count], ...]}  above F, ascending, off the settled ranges

:func:`encode` builds it; :func:`read_floor` and :func:`read_ranges` check it (anything
else raises :class:`~fabric.errors.BadParameter`) and give back the floor, the settled
spans and the kept receive counts for :meth:`KeySharedLeases.restore
<fabric.push.keyshared.KeySharedLeases.restore>`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fabric.errors import BadParameter
from fabric.push.leases import OFFSET_MAX, RECEIVE_COUNT_MAX
from fabric.push.ranges import RangeMap, RangeSet

SNAPSHOT_VERSION = 1


def encode(
    floor: int, offered_upto: int, counts_pending: Iterable[tuple[int, int]], spans: RangeSet, ahead: RangeMap[int]
) -> dict[str, object]:
    """The snapshot of a table: ``counts_pending`` are its pending offsets, ascending, with their receive
    counts; ``spans`` its offsets settled before they were offered; ``ahead`` its receive counts kept
    for offsets not offered again yet."""
    settled = RangeSet()
    counts = RangeMap[int]()
    pos = floor
    for o, rc in counts_pending:
        if o > pos:
            settled.add(pos, o)
        pos = o + 1
        if rc:
            counts.set(o, o + 1, rc)
    settled.add(pos, max(pos, offered_upto))
    for s, e in spans:
        settled.add(s, e)
    for s, e, rc in ahead:
        counts.set(s, e, rc)
    return {
        "version": SNAPSHOT_VERSION,
        "kind": "key_shared",
        "floor": floor,
        "settled": settled.to_list(),
        "counts": [[s, e, rc] for s, e, rc in counts],
    }


def read_floor(snapshot: Mapping[str, object]) -> int:
    """The floor of a key_shared snapshot, once its version and kind are checked."""
    if not isinstance(snapshot, Mapping) or snapshot.get("version") != SNAPSHOT_VERSION:
        raise BadParameter(f"not a version {SNAPSHOT_VERSION} key_shared lease snapshot")
    if snapshot.get("kind") != "key_shared":
        raise BadParameter(f"not a key_shared lease snapshot: kind {snapshot.get('kind')!r}")
    floor = snapshot.get("floor")
    if type(floor) is not int or not 0 <= floor <= OFFSET_MAX:
        raise BadParameter(f"snapshot floor must be an integer in 0..{OFFSET_MAX}, got {floor!r}")
    return floor


def read_ranges(snapshot: Mapping[str, object], floor: int) -> tuple[RangeSet, RangeMap[int]]:
    """The settled spans and the kept receive counts of a snapshot whose floor is ``floor``."""
    settled = RangeSet.from_list(snapshot.get("settled"))
    if settled.overlaps(0, floor + 1):
        raise BadParameter("snapshot has settled ranges at or below its floor")
    counts = snapshot.get("counts")
    if not isinstance(counts, list):
        raise BadParameter("snapshot counts must be a list")
    ahead: RangeMap[int] = RangeMap()
    pos = floor
    for item in counts:
        if not (isinstance(item, list) and len(item) == 3 and all(type(x) is int for x in item)):
            raise BadParameter(f"not a [start, end, receive_count] range: {item!r}")
        s, e, rc = item
        if not pos <= s < e <= OFFSET_MAX + 1 or not 1 <= rc <= RECEIVE_COUNT_MAX or settled.overlaps(s, e):
            raise BadParameter(f"snapshot count range {item!r} is out of order or overlaps settled offsets")
        ahead.set(s, e, rc)
        pos = e
    return settled, ahead
