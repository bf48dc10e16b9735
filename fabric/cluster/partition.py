"""PartitionRecord: what etcd holds per partition (``/fabric/partitions/<queue>/<p>``).

Minimal stand-in written by the controller helper so its branch runs on its own; the
replication helper's ``partition.py`` (same API) replaces it at merge.

Theory of operation
-------------------
``replicas`` is the placement (first = preferred leader), ``leader`` the node that may accept
writes (None: offline), ``leader_epoch`` is bumped by every election, ``isr`` the in-sync
replicas (the leader is always one of them), ``partition_epoch`` is bumped by every write of
the record. The JSON form is canonical (sorted keys), so compare-and-swap on the value works.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    replicas: tuple[str, ...]
    leader: str | None
    leader_epoch: int
    isr: tuple[str, ...]
    partition_epoch: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "replicas": list(self.replicas),
                "leader": self.leader,
                "leader_epoch": self.leader_epoch,
                "isr": list(self.isr),
                "partition_epoch": self.partition_epoch,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> PartitionRecord:
        raw = json.loads(data)
        leader = raw["leader"]
        return cls(
            replicas=tuple(str(r) for r in raw["replicas"]),
            leader=None if leader is None else str(leader),
            leader_epoch=int(raw["leader_epoch"]),
            isr=tuple(str(r) for r in raw["isr"]),
            partition_epoch=int(raw["partition_epoch"]),
        )
