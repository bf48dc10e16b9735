"""Asking for a queue move (``fabric queue move Q --to CLUSTER``): the plan a dry run shows, the
request the manager takes, a cancel, and waiting for the move to end. Writes only the move key in
phase ``requested`` (where no move of the queue is under way) and its ``cancel`` flag; the manager
does the rest (``fabric.federation.move_driver``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fabric.cluster.keys import GROUP_STATES_PREFIX, GROUPS_PREFIX
from fabric.cluster.meta import Compare, MetaStore, Put
from fabric.cluster.namespace import cluster_prefix
from fabric.errors import BadParameter, QueueExists, Timeout, UnknownQueue
from fabric.federation.directory import MANAGER_KEY, QueuePlacement, drain_key, queue_key
from fabric.federation.manager import read_draining, read_reports, read_table
from fabric.federation.move_local import read_moves
from fabric.federation.moves import Move, move_key, problem
from fabric.federation.rebalance import Proposal, drain, rebalance


def _placement(meta: MetaStore, queue: str) -> QueuePlacement | None:
    kv = meta.get(queue_key(queue))
    return QueuePlacement.from_json(kv.value) if kv is not None else None


def read_move(meta: MetaStore, queue: str) -> Move | None:
    kv = meta.get(move_key(queue))
    return Move.from_json(kv.value) if kv is not None else None


def plan_move(meta: MetaStore, queue: str, destination: str, now_ms: int) -> dict[str, Any]:
    """What ``fabric queue move --dry-run`` shows: from where to where, the partitions, the groups
    whose committed offsets and lease tables would be carried, and ``problem`` (None: it would be
    accepted now)."""
    placement = _placement(meta, queue)
    why = problem(queue, destination, placement, read_reports(meta), now_ms)
    if why is None and destination in read_draining(meta):
        why = f"cluster {destination} is being drained"
    current = read_move(meta, queue)
    if why is None and current is not None and not current.finished:
        why = f"queue {queue!r} is being moved already ({current.source} -> {current.destination}, {current.phase})"
    source = placement.clusters[0] if placement is not None and len(placement.clusters) == 1 else None
    groups: list[str] = []
    if source is not None:
        for prefix in (GROUPS_PREFIX, GROUP_STATES_PREFIX):
            base = f"{cluster_prefix(source)}{prefix}{queue}/"
            groups += [kv.key[len(base) :] for kv in meta.get_prefix(base)[0]]
    return {
        "queue": queue,
        "source": source,
        "destination": destination,
        "partitions": len(placement.partitions) if placement is not None else 0,
        "groups": sorted(set(groups)),
        "problem": why,
    }


def request_move(meta: MetaStore, queue: str, destination: str, now_ms: int) -> Move:
    """Write the move in phase ``requested``. Raises UnknownQueue, BadParameter (the move's
    problem), QueueExists (a move of it is under way)."""
    plan = plan_move(meta, queue, destination, now_ms)
    if plan["problem"] is not None:
        if "being moved already" in plan["problem"]:
            raise QueueExists(plan["problem"])
        if plan["partitions"] == 0:
            raise UnknownQueue(plan["problem"])
        raise BadParameter(plan["problem"])
    move = Move(queue, plan["source"], destination, started_ms=now_ms, updated_ms=now_ms)
    key = move_key(queue)
    kv = meta.get(key)
    own = Compare.absent(key) if kv is None else Compare.modified_at(key, kv.mod_revision)
    if not meta.txn([own], [Put(key, move.to_json())]).succeeded:
        raise QueueExists(f"queue {queue!r}: another move was asked for meanwhile")
    return move


def cancel_move(meta: MetaStore, queue: str) -> Move:
    """Ask the manager to roll the move back (honoured until the move has switched). Raises
    UnknownQueue (no move), BadParameter (the move has finished or switched)."""
    for _ in range(5):
        kv = meta.get(move_key(queue))
        if kv is None:
            raise UnknownQueue(f"queue {queue!r} is not being moved")
        move = Move.from_json(kv.value)
        if move.finished or move.phase in ("switched",):
            raise BadParameter(f"the move of {queue!r} is {move.phase}: too late to cancel")
        asked = replace(move, cancel=True)
        if meta.txn([Compare.modified_at(kv.key, kv.mod_revision)], [Put(kv.key, asked.to_json())]).succeeded:
            return asked
    raise Timeout(f"the move of {queue!r} kept changing; try again")


def wait_move(meta: MetaStore, queue: str, timeout_s: float, on_phase: Callable[[Move], None] | None = None) -> Move:
    """Wait until the move of ``queue`` has finished (done, cancelled or refused); ``on_phase``
    hears each phase seen. Raises Timeout (saying the phase, and whether a manager is elected)."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while True:
        move = read_move(meta, queue)
        if move is None:
            raise UnknownQueue(f"queue {queue!r} is not being moved")
        if move.phase != seen:
            seen = move.phase
            if on_phase is not None:
                on_phase(move)
        if move.finished:
            return move
        if time.monotonic() >= deadline:
            who = "" if meta.get(MANAGER_KEY) is not None else ": no federation manager is elected"
            raise Timeout(f"the move of {queue!r} is still {move.phase} after {timeout_s:g} s{who}")
        time.sleep(0.1)


def propose(meta: MetaStore, now_ms: int, drained: str | None = None) -> list[Proposal]:
    """``fabric federation rebalance`` (``drained`` None) or ``drain CLUSTER``: the moves proposed
    by ``fabric.federation.rebalance`` from the directory as it is now."""
    moving = {m.queue for _, m in read_moves(meta) if not m.finished}
    reports, table, draining = read_reports(meta), read_table(meta), read_draining(meta)
    if drained is None:
        return rebalance(reports, table, now_ms, moving=moving, draining=draining)
    if drained not in reports:
        raise UnknownQueue(f"no cluster {drained!r} reports to the federation")
    return drain(drained, reports, table, now_ms, moving=moving, draining=draining)


def set_draining(meta: MetaStore, cluster: str, on: bool) -> None:
    """Mark ``cluster`` as being drained (no new queue, no move to it), or not any more."""
    if on:
        meta.put(drain_key(cluster), b"{}")
    else:
        meta.delete(drain_key(cluster))


def ask_moves(meta: MetaStore, proposals: list[Proposal], now_ms: int) -> list[tuple[Proposal, str | None]]:
    """A move request for each proposal with a destination; each with None (asked) or why not."""
    out: list[tuple[Proposal, str | None]] = []
    for p in proposals:
        if p.destination is None:
            continue
        try:
            request_move(meta, p.queue, p.destination, now_ms)
            out.append((p, None))
        except (BadParameter, QueueExists, UnknownQueue) as e:
            out.append((p, e.message))
    return out
