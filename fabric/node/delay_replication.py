"""Delayed batches on replicated partitions, the node's side (issue 9).

Theory of operation
-------------------
The rules are in ``fabric.cluster.delayed``; this module wires them to the delay store
(``fabric.store.delays``), the replication roles (``fabric.node.replication``) and the due
processing (``fabric.node.delayed``), all on the loop's thread.

* **Taking** (leader): a delayed PRODUCE gets one delay id per batch (``DelayIds``), stamped
  into the batch; the rows go into this node's delay store and the ``LeaderReplica`` learns
  the newest row id. Parked follower fetches are woken.
* **Replicating**: a follower's REPLICA_FETCH carries ``delay_cursor``; when the leader holds
  rows past it, the reply carries them (``delayed``: ``[row id, delay id, due ms]`` per row,
  the batches as extra data frames after the log frame, oldest first, bounded) and
  ``delayed_upto``, the cursor the follower takes once it stored them. The follower stores
  them held (not due here) **before** it appends the log data of the same reply; a row the
  leader has appended already is never sent (its append is in the log).
* **acks=all** waits until the delay high watermark covers the request's last row
  (``LeaderReplica.delays_acked``), as PRODUCE waits for the HW.
* **Due** rows are appended by the leader only. Followers see the delay id in the appended
  batch's header (``fabric.protocol.batch.delay_id_of``), mark their row with the offset
  (``appended_at``) and drop it once their high watermark passes it; a truncation below a
  mark makes the row wait again.
* **Roles**: at start every replicated row is held. Becoming leader drops the rows whose
  append is already in the log, makes the rest wait again and releases them to due processing;
  becoming a follower holds them; a partition moved off this node takes its rows away.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from fabric.cluster.delayed import AppendedDelays, DelayIds
from fabric.errors import BadParameter, FabricError, NotEnoughReplicas, NotLeader
from fabric.protocol import frames as fr
from fabric.protocol.batch import BatchHeader, parse_header, stamp_delay_id

if TYPE_CHECKING:
    from fabric.node.replication import Replication
    from fabric.node.roles import Role
    from fabric.store.delays import DelayStore
    from fabric.store.store import Store

log = logging.getLogger("fabric.replication")
ROWS_PER_FETCH = 1000  # delayed rows sent with one REPLICA_FETCH reply, at most
ROW_BYTES_PER_FETCH = 4 * 1024 * 1024


class DelayedRows(Protocol):
    """What this module needs of the node's delayed delivery (``fabric.node.delayed``)."""

    store: DelayStore

    def refresh(self) -> None: ...

    @property
    def in_flight(self) -> set[int]: ...


class ReplicatedDelays:
    def __init__(self, repl: Replication, delayed: DelayedRows, logs: Store) -> None:
        self.repl = repl
        self.delayed = delayed
        self.logs = logs
        self.store = delayed.store
        self._ids: dict[tuple[str, int], DelayIds] = {}
        self._appended: dict[tuple[str, int], AppendedDelays] = {}
        # False while the store holds no replicated row: role changes then need no SQLite work
        self._any = self.store.has_replicated()
        if self._any:
            self.store.hold_all()  # this node leads nothing yet; the map releases what it leads
            delayed.refresh()

    # ------------------------------------------------------------------ roles

    def on_role(self, queue: str, p: int, role: Role, log_end: int) -> None:
        """``role`` was just taken for ``queue/p`` (leader, follower, or neither)."""
        key = (queue, p)
        if role.leader is None:
            if self._any:
                self.store.hold(queue, p, True)
                if key not in self._appended:
                    self._appended[key] = AppendedDelays(self.store.marks(queue, p))
                self.delayed.refresh()
            return
        row_end, highest = 0, None
        if self._any:
            marks = self._appended.pop(key, None) or AppendedDelays(self.store.marks(queue, p))
            done, again = marks.committed(log_end), marks.truncated(log_end)
            if done:  # their appends are in this log, which a leader never truncates
                self.store.remove_replicated(queue, p, done)
            if again:  # marked past our log end (a tail lost in a crash): they wait again
                self.store.unmark(queue, p, again)
            self.store.hold(queue, p, False)
            row_end, highest = self.store.highest(queue, p)
            self.delayed.refresh()
        ids = self._ids.get(key)
        if ids is None or ids.leader_epoch != role.record.leader_epoch:
            # kept while the epoch lasts: leading it again (same process) must not reuse an id
            self._ids[key] = DelayIds(role.record.leader_epoch, highest)
        role.leader.on_delay_stored(row_end)

    def forget(self, queue: str, p: int) -> None:
        """The partition moved off this node: its replicas elsewhere hold its delayed rows."""
        self._ids.pop((queue, p), None)
        self._appended.pop((queue, p), None)
        if self._any:
            try:
                self.store.remove_replicated(queue, p)
            except FabricError as exc:
                log.warning("could not drop the delayed rows of %s/%d: %s", queue, p, exc)
            self.delayed.refresh()

    # ------------------------------------------------------------------ leader: taking

    def leading(self, queue: str, p: int) -> Role | None:
        role = self.repl.roles.get((queue, p))
        return role if role is not None and role.leader is not None and (queue, p) in self._ids else None

    def check_acks_all(self, queue: str, p: int) -> None:
        """acks=all is refused before anything is stored when too few replicas are in sync."""
        role = self.leading(queue, p)
        if role is None or role.leader is None:
            if (queue, p) not in self.repl.roles:  # a priority level's log: not a replicated partition
                raise BadParameter(f"{queue}/{p} is not replicated: send its delayed messages with acks=leader")
            raise NotLeader(f"{queue}/{p}: this node does not lead it")
        problem = role.leader.not_enough_replicas()
        if problem is not None:
            raise NotEnoughReplicas(f"{queue}/{p}: {problem} (nothing stored)")

    def stamp(self, queue: str, p: int, batches: list[tuple[bytearray, BatchHeader]]) -> list[int] | None:
        """Give each batch a delay id in its header (None: this node does not lead ``queue/p``)."""
        if self.leading(queue, p) is None:
            return None
        try:
            ids = self._ids[(queue, p)].take(len(batches))
        except ValueError as exc:
            raise BadParameter(f"{queue}/{p}: {exc}; a new leader epoch starts the count again") from None
        for i, (buf, _) in enumerate(batches):
            batches[i] = (buf, stamp_delay_id(buf, ids[i]))
        return ids

    def stored(self, queue: str, p: int, row_id: int) -> None:
        """The leader stored delayed rows up to ``row_id``: followers fetch them."""
        self._any = True
        role = self.leading(queue, p)
        if role is not None and role.leader is not None:
            role.leader.on_delay_stored(row_id)
            self.repl.leader_fetches.wake(queue, p)

    def reply_when_replicated(
        self, queue: str, p: int, row_id: int, client: bytes, header: fr.Header, reply: dict[str, Any]
    ) -> None:
        """acks=all: the reply waits until every in-sync replica holds row ``row_id``."""
        role = self.leading(queue, p)
        assert role is not None and role.leader is not None
        frames = fr.encode(fr.Header(header.op, header.request_id, fr.FLAG_REPLY), reply)
        role.delay_waiting.append((row_id, client, frames))
        self.repl._advance(queue, p, role)

    # ------------------------------------------------------------------ leader: serving fetches

    def rows_for(self, queue: str, p: int, role: Role, cursor: int) -> tuple[dict[str, Any], list[bytes]]:
        """What a fetch with ``cursor`` gets: reply params (``delayed``, ``delayed_upto``) and frames."""
        assert role.leader is not None
        end = role.leader.delays_end
        if cursor >= end:
            return {}, []
        rows, complete = self.store.pending(queue, p, cursor, limit=ROWS_PER_FETCH, max_bytes=ROW_BYTES_PER_FETCH)
        busy = self.delayed.in_flight
        sent = [r for r in rows if r.id not in busy]  # appended, waiting for the fsync: in the log
        upto = end if complete else rows[-1].id
        meta = [[r.id, r.delay_id, r.due_ms] for r in sent]
        return {"delayed": meta, "delayed_upto": upto}, [r.batch for r in sent]

    # ------------------------------------------------------------------ follower

    def on_rows(self, queue: str, p: int, role: Role, params: dict[str, Any], frames: list[Any]) -> None:
        """A fetch reply's delayed rows: stored held, then the cursor moves (the next fetch says so)."""
        meta = params.get("delayed") or []
        upto = params["delayed_upto"]
        if not isinstance(upto, int) or not isinstance(meta, list) or len(meta) != len(frames):
            log.error("%s/%d: a fetch reply's delayed rows do not match its frames; ignored", queue, p)
            return
        rows = []
        try:
            for entry, frame in zip(meta, frames, strict=True):
                _, delay_id, due = entry
                parse_header(frame)
                rows.append((delay_id, due, bytes(frame)))
            settings = self.logs.settings(queue)
            self.store.add_replicated(queue, p, rows, held=True, durable=settings.fsync == "always")
        except (FabricError, ValueError, TypeError) as exc:
            log.error("%s/%d: could not store %d delayed row(s) from the leader: %s", queue, p, len(rows), exc)
            return  # the cursor stays: the next fetch asks for them again
        if rows:
            self._any = True
        role.delay_cursor = max(role.delay_cursor, upto)

    def on_appended(self, queue: str, p: int, marks: list[tuple[int, int]]) -> None:
        """The log just took these ``(offset, delay id)`` appends of delayed rows."""
        if not self._any:
            return
        try:
            held = self.store.mark(queue, p, marks)
        except FabricError as exc:
            log.error("%s/%d: could not mark delivered delayed rows: %s", queue, p, exc)
            return
        if held:
            appended = self._appended.setdefault((queue, p), AppendedDelays())
            for offset, delay_id in held:
                appended.add(offset, delay_id)

    def on_high_watermark(self, queue: str, p: int, hw: int) -> None:
        appended = self._appended.get((queue, p))
        if appended and appended.lowest is not None and appended.lowest < hw:
            done = appended.committed(hw)
            try:
                self.store.remove_replicated(queue, p, done)
            except FabricError as exc:
                log.error("%s/%d: could not drop delivered delayed rows: %s", queue, p, exc)
                for d in done:  # kept marked: tried again at the next high watermark
                    appended.add(hw - 1, d)

    def on_truncated(self, queue: str, p: int, cut: int) -> None:
        appended = self._appended.get((queue, p))
        if appended:
            again = appended.truncated(cut)
            if again:
                log.info("%s/%d: %d delayed row(s) wait again: their append was truncated", queue, p, len(again))
                self.store.unmark(queue, p, again)
