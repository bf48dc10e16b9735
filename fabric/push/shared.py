"""Shared consumption: the `queue` subscription kind (SQS semantics on a log).

Theory of operation
-------------------
A *shared group* is a named group on one queue whose members all draw from every
partition. Each partition has a lease table (:class:`PartitionLeases`): offsets
below its *floor* are settled; above it, an offset is never delivered, leased to
one member until a deadline, redeliverable (expired, nacked, or its holder left),
or dead (it reached the queue's ``max_receive_count``). Deliveries are offset
ranges, so the node does per-batch work: it pushes whole batches and tells the
member which offsets of them are leased to it (PUSH params ``leases``).

The group is in memory and checkpointed to the metadata store (``snapshot``),
at most once a second while it changes and at a clean shutdown. After a crash the
last checkpoint comes back: leases are gone (everything unsettled is delivered
again, with its receive count), settled offsets stay settled; acks after the
checkpoint are repeated deliveries, which is what at-least-once allows.

Priorities: a queue with ``priority_levels = L`` keeps level ``l`` of partition
``p`` in log ``l * P + p``. Each delivery pass of a member starts with one level,
picked by smooth weighted round robin with weight ``l + 1``, then goes on to the
other levels from the highest down, as far as the member's credit reaches. So
while the higher levels have messages they get nearly all of them, and the
lowest level still leads ``1 / (1 + 2 + ... + L)`` of the passes: it is never
starved (with 10 levels, at least 1 pass in 55).

Pure: no sockets, no files, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from fabric.push.keyshared import KeySharedLeases
from fabric.push.leases import PartitionLeases

CHECKPOINT_MS = 1000


class KeySharedTable(KeySharedLeases):
    """A key_shared lease table with the few calls a shared group makes of every table."""

    def drop_member(self, member: str, now_ms: int) -> int:
        return self.leave(member, now_ms) if member in self.members() else 0

    def backlog(self, high_watermark: int) -> int:
        """Unsettled messages below ``high_watermark``: offered ones plus those not offered yet."""
        return self.pending + max(0, high_watermark - self.offered_upto)

    def oldest_unsettled(self) -> int | None:
        return self.floor if self.pending else None

    def expirable(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """As PartitionLeases.expirable: the offsets nobody holds (new, given back, not offered yet).
        Taking an expired message away does not reorder its key: the rest keep their order.
        Per offset, which key_shared pays anyway."""
        out: list[tuple[int, int, int]] = []
        for o in range(max(start, self.floor), end):
            if self.state(o) in ("new", "redeliverable", "unoffered"):
                rc = self.receive_count(o)
                if out and out[-1][1] == o and out[-1][2] == rc:
                    out[-1] = (out[-1][0], o + 1, rc)
                else:
                    out.append((o, o + 1, rc))
        return out


Leases = PartitionLeases | KeySharedTable


@dataclass(slots=True)
class SharedGroup:
    queue: str
    name: str
    kind: str
    leases: dict[int, Leases]
    members: set[int] = field(default_factory=set)
    dirty: bool = False
    checkpointed_ms: int = 0
    levels: int = 1  # priority levels; partitions per level = len(leases) // levels
    _level_weights: list[int] = field(default_factory=list)  # smooth weighted round robin state

    def pass_order(self, parts: list[int], rr: int) -> list[int]:
        """The partitions of one delivery pass, in the order they get the member's credit."""
        n = len(parts)
        rotated = [parts[(rr + i) % n] for i in range(n)]
        if self.levels <= 1:
            return rotated
        per_level = max(1, len(self.leases) // self.levels)
        if not self._level_weights:
            self._level_weights = [0] * self.levels
        cur = self._level_weights
        total = 0
        for level in range(self.levels):
            cur[level] += level + 1
            total += level + 1
        lead = max(range(self.levels), key=lambda lv: (cur[lv], lv))
        cur[lead] -= total
        order = [lead] + [lv for lv in range(self.levels - 1, -1, -1) if lv != lead]
        rank = {lv: i for i, lv in enumerate(order)}
        return sorted(rotated, key=lambda p: rank.get(min(p // per_level, self.levels - 1), 0))

    @classmethod
    def create(
        cls,
        queue: str,
        name: str,
        kind: str,
        *,
        floors: dict[int, int],
        state: dict[str, Any] | None,
        visibility_ms: int,
        max_receive_count: int,
        levels: int = 1,
    ) -> SharedGroup:
        """A group over partitions ``floors`` (partition -> where a new group starts)."""
        saved = (state or {}).get("leases", {})
        table: type[PartitionLeases] | type[KeySharedTable] = (
            KeySharedTable if kind == "key_shared" else PartitionLeases
        )
        leases: dict[int, Leases] = {}
        for p, floor in floors.items():
            snap = saved.get(str(p))
            if isinstance(snap, dict):
                try:
                    leases[p] = cast(
                        Leases,
                        table.restore(snap, visibility_ms=visibility_ms, max_receive_count=max_receive_count),
                    )
                    if leases[p].floor < floor:  # retention removed what the group had not settled
                        leases[p].settle(leases[p].floor, floor)
                    continue
                except (KeyError, TypeError, ValueError):
                    pass  # a damaged checkpoint: start the partition from its floor
            leases[p] = table(floor, visibility_ms=visibility_ms, max_receive_count=max_receive_count)
        return cls(queue, name, kind, leases, levels=levels)

    def grow(self, partitions: list[int], *, visibility_ms: int, max_receive_count: int) -> None:
        """New partitions (``fabric queue alter --partitions``): leased from offset 0; key_shared
        tables take in every current member."""
        table: type[PartitionLeases] | type[KeySharedTable] = (
            KeySharedTable if self.kind == "key_shared" else PartitionLeases
        )
        for p in partitions:
            if p in self.leases:
                continue
            pl = self.leases[p] = table(0, visibility_ms=visibility_ms, max_receive_count=max_receive_count)
            if isinstance(pl, KeySharedTable):
                for sub_id in sorted(self.members):
                    pl.join(self.member(sub_id))
        self.dirty = True

    def join(self, sub_id: int) -> None:
        self.members.add(sub_id)
        for pl in self.leases.values():
            if isinstance(pl, KeySharedTable):
                pl.join(self.member(sub_id))

    @staticmethod
    def member(sub_id: int) -> str:
        return str(sub_id)

    def snapshot(self) -> dict[str, Any]:
        return {"kind": self.kind, "leases": {str(p): pl.snapshot() for p, pl in self.leases.items()}}

    def floors(self) -> dict[int, int]:
        return {p: pl.floor for p, pl in self.leases.items()}

    def expire(self, now_ms: int) -> int:
        n = sum(pl.expire(now_ms) for pl in self.leases.values())
        if n:
            self.dirty = True
        return n

    def drop_member(self, sub_id: int, now_ms: int) -> int:
        self.members.discard(sub_id)
        n = sum(pl.drop_member(self.member(sub_id), now_ms) for pl in self.leases.values())
        if n:
            self.dirty = True
        return n

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for d in (pl.next_deadline_ms() for pl in self.leases.values()) if d is not None]
        return min(deadlines) if deadlines else None

    def describe(self, high_watermarks: dict[int, int], now_ms: int) -> dict[str, Any]:
        backlog = sum(pl.backlog(high_watermarks.get(p, pl.floor)) for p, pl in self.leases.items())
        oldest = [pl.oldest_unsettled() for pl in self.leases.values()]
        return {
            "kind": self.kind,
            "members": len(self.members),
            "backlog": backlog,
            "in_flight": sum(pl.in_flight for pl in self.leases.values()),
            "redeliverable": sum(pl.redeliverable for pl in self.leases.values()),
            "floors": {str(p): pl.floor for p, pl in self.leases.items()},
            "committed": {str(p): pl.floor for p, pl in self.leases.items()},
            "lag": {str(p): pl.backlog(high_watermarks.get(p, pl.floor)) for p, pl in self.leases.items()},
            "total_lag": backlog,
            "oldest_unsettled": {str(p): o for p, o in zip(self.leases, oldest) if o is not None},
        }
