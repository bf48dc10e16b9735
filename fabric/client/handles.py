"""Receipt handles: how a queue subscription's delivery is named for settling it later, from
another process (``fabric recv --kind queue --no-ack`` prints them; ``fabric ack`` / ``nack`` /
``change-visibility`` take them), as SQS's receive-message and delete-message do. Pure.

A handle is ``MEMBER.PARTITION.OFFSET``: the subscription that received the message (its lease
holder in the group), the partition log and the offset, decimal. Handles of one member and
partition are sent as offset ranges (SETTLE, docs/protocol.md).
"""

from __future__ import annotations

import re

from fabric.errors import BadParameter
from fabric.protocol.ops import I64_MAX, RANGES_MAX

_HANDLE = re.compile(r"([1-9][0-9]{0,18})\.(0|[1-9][0-9]{0,4})\.(0|[1-9][0-9]{0,18})")


def make_handle(member: int, partition: int, offset: int) -> str:
    return f"{member}.{partition}.{offset}"


def parse_handle(handle: str) -> tuple[int, int, int]:
    """``(member, partition, offset)`` of a handle, or BadParameter naming it."""
    m = _HANDLE.fullmatch(handle.strip())
    if m is None:
        raise BadParameter(
            f"{handle!r} is not a receipt handle (MEMBER.PARTITION.OFFSET, as `fabric recv --no-ack` prints)"
        )
    member, partition, offset = (int(x) for x in m.groups())
    if member > I64_MAX or partition > 65535 or offset > I64_MAX:
        raise BadParameter(f"receipt handle {handle!r} is out of range")
    return member, partition, offset


def handle_ranges(handles: list[str]) -> dict[int, dict[str, list[list[int]]]]:
    """Per member, the ``{"partition": [[start, end], ...]}`` ranges the handles name (merged,
    sorted; a handle given twice counts once). BadParameter for a bad handle or too many ranges."""
    spans: dict[int, dict[int, set[int]]] = {}
    for h in handles:
        member, p, offset = parse_handle(h)
        spans.setdefault(member, {}).setdefault(p, set()).add(offset)
    out: dict[int, dict[str, list[list[int]]]] = {}
    for member, parts in spans.items():
        ranges: dict[str, list[list[int]]] = {}
        count = 0
        for p, offsets in sorted(parts.items()):
            rs: list[list[int]] = []
            for o in sorted(offsets):
                if rs and rs[-1][1] == o:
                    rs[-1][1] = o + 1
                else:
                    rs.append([o, o + 1])
            ranges[str(p)] = rs
            count += len(rs)
        if count > RANGES_MAX:
            raise BadParameter(f"the handles of member {member} make {count} ranges; at most {RANGES_MAX} at once")
        out[member] = ranges
    return out
