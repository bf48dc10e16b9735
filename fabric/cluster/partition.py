"""The replication state of one partition as the cluster's metadata store holds it.

Theory of operation
-------------------
``/fabric/partitions/<queue>/<p>`` holds one ``PartitionRecord`` as JSON:
``{"replicas": [...], "leader": name or null, "leader_epoch": n, "isr": [...],
"partition_epoch": n}``.

- ``replicas``: the nodes that host the partition, in placement order (the first is preferred).
- ``leader``: the node that takes writes, or null when no in-sync replica is alive.
- ``leader_epoch``: bumped by the controller on every election; every batch is stamped with it
  and every fetch and produce is checked against it (fencing of deposed leaders).
- ``isr``: the in-sync replicas; the leader is always one of them. A record is committed once
  every ISR member has it; only ISR members may be elected (unless a queue allows unclean
  election).
- ``partition_epoch``: bumped by every change of the record; every change is a compare-and-swap
  on it, so a deposed leader's ISR change fails.

Records are immutable values; ``with_isr`` and ``with_leader`` return the next record (epochs
bumped). A record that breaks a rule (leader not in the ISR, ISR member not a replica, duplicate
names, negative epochs, wrong JSON types) is refused with a ``ValueError`` that says which field
and why. Unknown JSON keys are ignored, so a newer controller may add fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["PartitionRecord"]


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    replicas: tuple[str, ...]
    leader: str | None
    leader_epoch: int
    isr: tuple[str, ...]
    partition_epoch: int

    def __post_init__(self) -> None:
        _check_names("replicas", self.replicas)
        if not self.replicas:
            raise ValueError("partition record: replicas is empty")
        _check_names("isr", self.isr)
        strangers = [r for r in self.isr if r not in self.replicas]
        if strangers:
            raise ValueError(f"partition record: isr members {strangers} are not replicas {list(self.replicas)}")
        if self.leader is not None:
            if not isinstance(self.leader, str) or not self.leader:
                raise ValueError(f"partition record: leader must be a node name or None, not {self.leader!r}")
            if self.leader not in self.isr:
                raise ValueError(f"partition record: leader {self.leader!r} is not in the isr {list(self.isr)}")
        _check_epoch("leader_epoch", self.leader_epoch)
        _check_epoch("partition_epoch", self.partition_epoch)

    # ---- next records

    def with_isr(self, isr: Iterable[str]) -> PartitionRecord:
        """The record with ``isr`` (kept in replica order) and the partition epoch bumped."""
        members = set(isr)
        ordered = tuple(r for r in self.replicas if r in members)
        missing = members - set(ordered)
        if missing:
            raise ValueError(f"partition record: isr members {sorted(missing)} are not replicas {list(self.replicas)}")
        return PartitionRecord(self.replicas, self.leader, self.leader_epoch, ordered, self.partition_epoch + 1)

    def with_leader(self, leader: str | None, isr: Iterable[str] | None = None) -> PartitionRecord:
        """The record after an election of ``leader`` (None: no leader): both epochs bumped;
        ``isr`` replaces the ISR when given (kept in replica order)."""
        members = set(self.isr if isr is None else isr)
        ordered = tuple(r for r in self.replicas if r in members)
        if len(ordered) != len(members):
            raise ValueError(f"partition record: isr {sorted(members)} names nodes that are not replicas")
        return PartitionRecord(self.replicas, leader, self.leader_epoch + 1, ordered, self.partition_epoch + 1)

    # ---- JSON

    def to_json(self) -> bytes:
        doc = {
            "replicas": list(self.replicas),
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "isr": list(self.isr),
            "partition_epoch": self.partition_epoch,
        }
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> PartitionRecord:
        """The record of ``to_json`` bytes; ValueError names the field that is wrong."""
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"partition record is not UTF-8 JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"partition record must be a JSON object, not {type(doc).__name__}")
        return cls(
            replicas=_names(doc, "replicas"),
            leader=_leader(doc),
            leader_epoch=_epoch(doc, "leader_epoch"),
            isr=_names(doc, "isr"),
            partition_epoch=_epoch(doc, "partition_epoch"),
        )


def _field(doc: dict[str, Any], key: str) -> Any:
    if key not in doc:
        raise ValueError(f"partition record: missing field {key!r}")
    return doc[key]


def _names(doc: dict[str, Any], key: str) -> tuple[str, ...]:
    value = _field(doc, key)
    if not isinstance(value, list):
        raise ValueError(f"partition record: {key} must be a list of node names, not {value!r}")
    return tuple(value)  # element checks in __post_init__


def _leader(doc: dict[str, Any]) -> str | None:
    value = _field(doc, "leader")
    if value is not None and not isinstance(value, str):
        raise ValueError(f"partition record: leader must be a node name or null, not {value!r}")
    return value


def _epoch(doc: dict[str, Any], key: str) -> int:
    value = _field(doc, key)
    _check_epoch(key, value)
    return int(value)


def _check_names(key: str, names: object) -> None:
    if not isinstance(names, tuple):
        raise ValueError(f"partition record: {key} must be a tuple of node names, not {names!r}")
    for n in names:
        if not isinstance(n, str) or not n:
            raise ValueError(f"partition record: {key} holds {n!r}, not a node name")
    if len(set(names)) != len(names):
        raise ValueError(f"partition record: {key} names a node twice: {list(names)}")


def _check_epoch(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"partition record: {key} must be an int >= 0, not {value!r}")
