"""The admin client: queues, offsets, node health. Synchronous request/reply."""

from __future__ import annotations

from typing import Any

from fabric.client.connection import Connection
from fabric.protocol.ops import Op


class Admin:
    def __init__(self, endpoint: str | None = None, *, timeout_ms: int = 10_000) -> None:
        self._conn = Connection(endpoint, timeout_ms=timeout_ms)
        self.endpoint = self._conn.endpoint

    def _call(self, op: Op, **params: Any) -> dict[str, Any]:
        return self._conn.request(op, params).params

    def ping(self) -> dict[str, Any]:
        return self._call(Op.PING)

    def create_queue(self, name: str, *, if_not_exists: bool = False, **settings: Any) -> dict[str, Any]:
        """Create a queue; ``settings`` are QueueSettings keys (partitions, fsync, retention_ms, ...)."""
        return self._call(Op.CREATE_QUEUE, name=name, settings=settings, if_not_exists=if_not_exists)

    def delete_queue(self, name: str, *, if_exists: bool = False) -> bool:
        return bool(self._call(Op.DELETE_QUEUE, name=name, if_exists=if_exists)["deleted"])

    def list_queues(self) -> list[dict[str, Any]]:
        return list(self._call(Op.LIST_QUEUES)["queues"])

    def describe_queue(self, name: str) -> dict[str, Any]:
        return self._call(Op.DESCRIBE_QUEUE, name=name)

    def list_offsets(self, queue: str, partition: int, at: str | int = "latest") -> dict[str, Any]:
        return self._call(Op.LIST_OFFSETS, queue=queue, partition=partition, at=at)

    def committed(self, queue: str, group: str) -> dict[int, int]:
        offsets = self._call(Op.COMMITTED, queue=queue, group=group)["offsets"]
        return {int(p): o for p, o in offsets.items()}

    def commit(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        self._call(Op.COMMIT, queue=queue, group=group, offsets={str(p): o for p, o in offsets.items()})

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
