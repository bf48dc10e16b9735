"""The storage layer: partition logs of segment files, their recovery, metadata and group commit.

Modules, smallest first: ``files`` (naming, atomic writes), ``index`` (sparse
offset and time indexes), ``segment`` (one segment file), ``tail_cache``,
``recovery`` (loading a partition directory), ``log`` (``PartitionLog``),
``flusher`` (the group-commit thread), ``metadata`` (``NodeMetadata``),
``checkpoints`` (the replication checkpoint files: high watermarks, leader epochs) and
``store`` (``Store``: every queue of a node).
"""

from fabric.store.flusher import Flusher
from fabric.store.log import PartitionLog
from fabric.store.metadata import NodeMetadata
from fabric.store.recovery import RecoveryReport
from fabric.store.store import Store

__all__ = ["Flusher", "NodeMetadata", "PartitionLog", "RecoveryReport", "Store"]
