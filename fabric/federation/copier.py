"""The data plane of a queue move between clusters: the source's batches copied to the destination,
byte for byte, and the thread that drives moves on the manager's store.

Theory of operation
-------------------
``ClientPlane.copy(move)`` talks to both clusters as a client, to their stores (any store is an
entry point; else their routers): not through the routers first, whose front door redirects a
request for a queue the directory places on another cluster, which each side's copy is for part
of the move. Per partition: LIST_OFFSETS at each leader (high watermark, log end,
whether it is sealed), then FETCH from the source at the destination's log end (whole stored
batches, up to the source's high watermark) and PRODUCE of those same bytes to the destination
with ``move_copy`` (let into the sealed copy) and acks=all. The destination's store assigns each
batch the next offset, which is the source's offset because the copy starts where the source's
log starts (0; a source log that starts later is refused: ``MoveFailed``) and appends every batch
in order; every reply's offsets are checked against the source's. A batch of an idempotent
producer carries its producer id and sequence, so the destination learns the producers' states
from the copy, and a retry of the copy's own request is stored once. The plane keeps nothing
between calls but connections: where the copy stands is the destination's log end, so a new
manager (after a kill -9 of the old one) just goes on.

``MoveWorker`` is a thread beside the node's cluster thread (copying blocks on the network, which
the cluster thread must not): every ``STEP_S`` while its store is the federation manager it runs
``MoveDriver.step`` with the manager's epoch, each step copying at most ``COPY_BYTES_PER_STEP``
per partition.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fabric.cluster.etcd import EtcdClient
from fabric.cluster.keys import NODES_PREFIX
from fabric.cluster.meta import MetaStore
from fabric.cluster.namespace import cluster_prefix
from fabric.errors import FabricError
from fabric.federation.directory import ClusterReport, cluster_key
from fabric.federation.move_driver import MoveDriver, MoveFailed
from fabric.federation.moves import Move, PartitionProgress
from fabric.protocol.batch import iter_batches
from fabric.protocol.ops import Op
from fabric.transport.connection import BaseConnection, connect

log = logging.getLogger(__name__)
STEP_S = 0.05
COPY_BYTES_PER_STEP = 8 * 1024 * 1024  # per partition and step: the source keeps serving its clients
FETCH_BYTES = 9 * 1024 * 1024  # more than a queue's largest batch (max_batch_bytes, 8 MiB by default)
TIMEOUT_MS = 5_000
BATCHES_PER_PRODUCE = 1000  # under a node's max_batches_per_request (1024)


class ClientPlane:
    def __init__(self, meta: MetaStore) -> None:
        self._meta = meta
        self._conns: dict[tuple[str, str], tuple[str, BaseConnection]] = {}

    def _endpoints(self, cluster: str) -> str:
        kv = self._meta.get(cluster_key(cluster))
        routers = list(ClusterReport.from_json(kv.value).routers) if kv is not None else []
        nodes = []
        for n in self._meta.get_prefix(cluster_prefix(cluster) + NODES_PREFIX)[0]:
            try:
                nodes.append(str(json.loads(n.value)["endpoint"]))
            except (ValueError, KeyError, TypeError):
                continue
        return ",".join(sorted(nodes) or routers)

    def _conn(self, queue: str, cluster: str) -> BaseConnection | None:
        endpoints = self._endpoints(cluster)
        if not endpoints:
            return None
        held = self._conns.get((queue, cluster))
        if held is not None and held[0] == endpoints:
            return held[1]
        if held is not None:
            held[1].close()
        conn = connect(endpoints, timeout_ms=TIMEOUT_MS, spread=False)
        self._conns[(queue, cluster)] = (endpoints, conn)
        return conn

    def forget(self, queue: str) -> None:
        for key in [k for k in self._conns if k[0] == queue]:
            self._conns.pop(key)[1].close()

    def close(self) -> None:
        for _, conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def copy(self, move: Move) -> list[PartitionProgress] | None:
        src, dst = self._conn(move.queue, move.source), self._conn(move.queue, move.destination)
        if src is None or dst is None:
            return None
        try:
            return [self._copy_partition(move.queue, p, src, dst) for p in range(move.partitions)]
        except MoveFailed:
            raise
        except FabricError as e:  # a leader moving, a link lost, the destination not created yet
            log.debug("move of %s: copy step: %s", move.queue, e)
            return None

    def _copy_partition(self, queue: str, p: int, src: BaseConnection, dst: BaseConnection) -> PartitionProgress:
        s = _offsets(src, queue, p)
        d = _offsets(dst, queue, p)
        end = d["log_end_offset"]
        if end == 0 and s["log_start_offset"] > 0:
            raise MoveFailed(
                f"{queue}/{p} on the source starts at offset {s['log_start_offset']} (purged or trimmed): "
                "its offsets could not be kept"
            )
        budget = COPY_BYTES_PER_STEP
        while end < s["high_watermark"] and budget > 0:
            params = {"queue": queue, "partition": p, "offset": end, "max_bytes": FETCH_BYTES, "wait_ms": 0}
            reply = src.request(Op.FETCH, params, timeout_ms=TIMEOUT_MS)
            data = b"".join(bytes(x) for x in reply.data)
            batches = [(h.base_offset, bytes(data[pos : pos + h.size])) for pos, h in iter_batches(data)]
            if not batches:
                break
            if batches[0][0] != end:
                raise MoveFailed(f"{queue}/{p}: the source's batch at {end} starts at {batches[0][0]}")
            for i in range(0, len(batches), BATCHES_PER_PRODUCE):
                chunk = batches[i : i + BATCHES_PER_PRODUCE]
                produce = {"queue": queue, "partition": p, "acks": "all", "move_copy": chunk[0][0]}
                answer = dst.request(Op.PRODUCE, produce, [b for _, b in chunk], timeout_ms=TIMEOUT_MS)
                stored = answer.params.get("offsets", [])
                if stored != [o for o, _ in chunk]:
                    raise MoveFailed(
                        f"{queue}/{p}: the destination stored batches at {stored[:3]}..., "
                        f"the source holds them at {[o for o, _ in chunk][:3]}..."
                    )
            end = _next_offset(data)
            budget -= len(data)
        d = _offsets(dst, queue, p)
        return PartitionProgress(s["high_watermark"], s["log_end_offset"], bool(s.get("sealed")), _dest_end(d))


def _offsets(conn: BaseConnection, queue: str, p: int) -> dict[str, Any]:
    return conn.request(Op.LIST_OFFSETS, {"queue": queue, "partition": p, "at": "latest"}, timeout_ms=TIMEOUT_MS).params


def _dest_end(d: dict[str, Any]) -> int:
    """Where the destination's copy ends, counted only once every replica holds it."""
    return int(d["high_watermark"]) if d["high_watermark"] == d["log_end_offset"] else -1


def _next_offset(data: bytes) -> int:
    nxt = 0
    for _, h in iter_batches(data, verify=False):
        nxt = h.next_offset
    return nxt


class MoveWorker(threading.Thread):
    """Drives the federation's queue moves while ``epoch()`` (the manager epoch of this store's
    candidate) is set; its own etcd client and connections."""

    def __init__(self, etcd: list[str], name: str, epoch: Callable[[], int]) -> None:
        super().__init__(name=f"fabric-moves-{name}", daemon=True)
        self._meta = EtcdClient(etcd)
        self._epoch = epoch
        self._driver = MoveDriver(self._meta, name)
        self._plane = ClientPlane(self._meta)
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            while not self._halt.wait(STEP_S):
                epoch = self._epoch()
                if not epoch:
                    continue
                try:
                    self._driver.step(int(time.time() * 1000), epoch, self._plane)
                except Exception:  # a bug must not end the thread: logged, tried again next step
                    log.exception("federation moves: step failed")
        finally:
            self._plane.close()
            self._meta.close()
