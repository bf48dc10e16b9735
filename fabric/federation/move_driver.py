"""The manager's side of moving queues between clusters: each move's phase carried on, one fenced
write at a time (``fabric.federation.moves`` has the phases and the rules).

Theory of operation
-------------------
``MoveDriver.step(now_ms, epoch, plane)`` reads every move under ``/federation/moves/`` and, for
each one under way, does what its phase asks: checks a request (``accept``/``refuse``), asks the
data plane to copy and report each partition's progress (``copying``/``cutover``), switches the
directory, or checks that the clusters' controllers have made their copies what the phase says
(``switched``/``cancelling``). Every write is one txn that checks the manager epoch and the move
key's mod_revision, so a deposed manager writes nothing and a manager killed between two writes
leaves a phase its successor resumes from. The data plane (``CopyPlane``) is the only I/O: the
real one (``fabric.federation.copier``) fetches the source's batches and appends them to the
destination; the simulation's keeps logs in memory. It is stateless across calls: where the
copy stands is read from the destination's log end each time, so a new manager just calls it.

Time is passed in; nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import logging
from typing import Protocol

from fabric.cluster.keys import GROUP_STATES_PREFIX, GROUPS_PREFIX
from fabric.cluster.meta import Compare, KeyValue, MetaStore, MetaUnavailable, Put
from fabric.cluster.namespace import cluster_prefix
from fabric.federation.directory import MANAGER_KEY, QueuePlacement, queue_key
from fabric.federation.manager import read_draining, read_reports
from fabric.federation.move_local import local_queue, read_moves
from fabric.federation.moves import (
    CANCELLING,
    COPYING,
    CUTOVER,
    REQUESTED,
    SWITCHED,
    Move,
    PartitionProgress,
    lost,
    next_event,
    problem,
)

log = logging.getLogger(__name__)


class MoveFailed(Exception):
    """The copy cannot go on (the source's log does not start at 0, offsets disagree): roll back."""


class CopyPlane(Protocol):
    def copy(self, move: Move) -> list[PartitionProgress] | None:
        """Copy some of each partition (bounded work) and say where each stands; None when a
        cluster could not be reached this time. Raises MoveFailed."""
        ...

    def forget(self, queue: str) -> None:
        """The move of ``queue`` is over here: drop connections kept for it."""
        ...


class MoveDriver:
    def __init__(self, meta: MetaStore, name: str) -> None:
        self._meta = meta  # un-namespaced
        self.name = name

    def step(self, now_ms: int, epoch: int, plane: CopyPlane) -> None:
        """Carry every move under way one step on (``epoch``: the manager epoch; 0 does nothing)."""
        if not epoch:
            return
        for kv, move in read_moves(self._meta):
            if move.finished:
                continue
            try:
                self._step_one(kv, move, now_ms, epoch, plane)
            except MetaUnavailable as e:
                log.debug("move of %s: metadata unavailable: %s", move.queue, e)

    def _step_one(self, kv: KeyValue, move: Move, now_ms: int, epoch: int, plane: CopyPlane) -> None:
        if move.phase == REQUESTED:
            self._check_request(kv, move, now_ms, epoch)
        elif move.phase in (COPYING, CUTOVER):
            why = self._why_stop(move, now_ms)
            progress = None
            if why is None:
                try:
                    progress = plane.copy(move)
                except MoveFailed as e:
                    why = f"the copy failed: {e}"
            if why is not None:
                self._write(kv, move.on("cancel", now_ms, error=why), epoch)
                return
            event = next_event(move, progress)
            if event == "caught_up":
                self._write(kv, move.on(event, now_ms), epoch)
            elif event == "switch":
                assert progress is not None
                self._switch(kv, move, [x.dest_end for x in progress], now_ms, epoch)
        elif move.phase == SWITCHED:
            dest = local_queue(self._meta, move.destination, move.queue)
            if (
                dest is not None
                and not dest["settings"].get("sealed")
                and (local_queue(self._meta, move.source, move.queue) is None)
            ):
                plane.forget(move.queue)
                self._write(kv, move.on("cleaned", now_ms), epoch)
        elif move.phase == CANCELLING:
            src = local_queue(self._meta, move.source, move.queue)
            if local_queue(self._meta, move.destination, move.queue) is None and (
                src is None or not src["settings"].get("sealed")
            ):
                plane.forget(move.queue)
                self._write(kv, move.on("rolled_back", now_ms), epoch)

    def _check_request(self, kv: KeyValue, move: Move, now_ms: int, epoch: int) -> None:
        pkv = self._meta.get(queue_key(move.queue))
        placement = QueuePlacement.from_json(pkv.value) if pkv is not None else None
        why = problem(move.queue, move.destination, placement, read_reports(self._meta), now_ms)
        if why is None and move.destination in read_draining(self._meta):
            why = f"cluster {move.destination} is being drained"
        if why is None and placement is not None and placement.clusters != (move.source,):
            why = f"queue {move.queue!r} is on {','.join(placement.clusters)}, not on {move.source}"
        if why is not None:
            self._write(kv, move.on("refuse", now_ms, error=why), epoch)
        else:
            assert placement is not None
            accepted = move.on("accept", now_ms, partitions=len(placement.partitions), started_ms=now_ms)
            self._write(kv, accepted, epoch)
            log.info("manager %s: moving %s from %s to %s", self.name, move.queue, move.source, move.destination)

    def _why_stop(self, move: Move, now_ms: int) -> str | None:
        if move.cancel:
            return "cancelled on request"
        reports = read_reports(self._meta)
        return lost(move.source, reports, now_ms) or lost(move.destination, reports, now_ms)

    def _switch(self, kv: KeyValue, move: Move, ends: list[int], now_ms: int, epoch: int) -> None:
        """cutover -> switched, the directory pointed at the destination and the groups' offsets
        and lease tables copied there, in one txn."""
        pkv = self._meta.get(queue_key(move.queue))
        if pkv is None:
            self._write(kv, move.on("cancel", now_ms, error="the queue left the directory"), epoch)
            return
        placement = QueuePlacement.from_json(pkv.value)
        switched = QueuePlacement(
            move.queue, (move.destination,) * move.partitions, placement.created_ms, placement.settings
        )
        src, dst = cluster_prefix(move.source), cluster_prefix(move.destination)
        carried: list[Put] = []
        for prefix in (GROUPS_PREFIX, GROUP_STATES_PREFIX):
            for g in self._meta.get_prefix(f"{src}{prefix}{move.queue}/")[0]:
                carried.append(Put(dst + g.key[len(src) :], g.value))
        new = move.on("switch", now_ms, sealed_at=tuple(ends))
        done = self._write(
            kv,
            new,
            epoch,
            [Compare.modified_at(queue_key(move.queue), pkv.mod_revision)],
            [Put(queue_key(move.queue), switched.to_json()), *carried],
        )
        if done:
            log.info(
                "manager %s: %s switched to %s at %s (%d group key(s) carried)",
                self.name,
                move.queue,
                move.destination,
                list(ends),
                len(carried),
            )

    def _write(
        self,
        kv: KeyValue,
        move: Move,
        epoch: int,
        compares: list[Compare] | None = None,
        ops: list[Put] | None = None,
    ) -> bool:
        fence = [Compare.created_at(MANAGER_KEY, epoch), Compare.modified_at(kv.key, kv.mod_revision)]
        result = self._meta.txn([*fence, *(compares or [])], [Put(kv.key, move.to_json()), *(ops or [])])
        return result.succeeded
