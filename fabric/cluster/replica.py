"""Leader and follower state machines of one replicated partition: positions, ISR, high watermark,
fetch checks and truncation. Pure: no sockets, files or clocks; the node feeds in what happened.

Theory of operation
-------------------
One replica leads the partition for one ``leader_epoch``; the others fetch from it. A fetch
(``FetchRequest``) names the follower's log end (``fetch_offset``), the epoch of its last batch
(``last_fetched_epoch``) and the leader epoch it believes in. The leader (``LeaderReplica.on_fetch``)
answers with a ``FetchDecision``:

- ``leader_epoch`` older than the leader's: ``FencedLeaderEpoch`` (the follower must refresh);
  newer: ``NotLeader`` (this leader is stale). A deposed leader answers ``NotLeader`` too.
- ``diverging=(e, end)`` when the leader's epoch cache (KIP-279/KIP-320) says the follower's last
  epoch ended earlier here, or is not known here: the follower truncates (``on_diverging``) and
  asks again. The position is then *not* recorded.
- otherwise ``read_from=fetch_offset``: the follower's log equals the leader's below
  ``fetch_offset`` (same epoch at the same offset means same batch), so the leader records it as
  the follower's position in this term; the caller sends the batches from there.

High watermark (HW): the lowest log end over the ISR, counting only positions reported in this
leader epoch; until every member has fetched in this term it does not move, and it never moves
back. The ISR used is the committed one plus any members a pending expansion adds (KIP-497's
"maximal ISR"): a member the leader has proposed may be elected as soon as the proposal commits,
so the HW must not pass its log end meanwhile. A pending shrink is not applied before it commits:
records are only acknowledged with an ISR that the metadata store holds.

ISR changes: a member that has not been caught up to the leader's log end for ``lag_time_ms``
leaves (Kafka's lastCaughtUpTime: a fetch at the leader's end, or at the end the leader had at
the follower's previous fetch, proves it caught up then; so does a fetch parked at the log end
when the leader appends: ``on_append``'s ``waiting``); a replica joins once its position in
this term is at or past the HW and past the start of this leader epoch. ``isr_change`` returns the
proposed record (partition epoch bumped, at most one in flight); the node compare-and-swaps it
into the store and reports with ``on_isr_result``. Only a committed record changes the ISR. A
record that names another leader or epoch deposes this one for good.

``acked(end)`` (acks=all): the HW is at or past ``end`` and the committed ISR has at least
``min_insync`` members; ``not_enough_replicas()`` says why not when the ISR is too small.

Delayed batches (``fabric.cluster.delayed``) wait in every replica's delay store. The leader
numbers the rows of its store (``on_delay_stored(row_id)``, increasing) and each fetch carries
the follower's ``delay_cursor``: it holds every row up to that id that the leader still has
(the leader sends the rows past it with the fetch reply). The *delay high watermark* is the
lowest cursor over the same members as the HW, counted the same way (unknown until each has
fetched in this term, never back); ``delays_acked(row_id)`` is acks=all for a delayed batch.
A replica joins the ISR only once its cursor has reached the delay high watermark too, so
every ISR member holds every delayed batch acknowledged with acks=all.

The follower (``FollowerReplica``) keeps its log end, epoch cache and HW: ``next_fetch()`` is the
request to send; ``on_diverging`` computes the truncation point by Kafka's rule (the end of the
largest epoch both know, never the HW); ``on_appended`` records fetched batches and the leader's
HW (the follower's HW is min(leader HW, own log end) and never goes back, except by truncation).
A response is applied only while ``is_current(request)`` (a late answer to an older request can
carry a stale divergence point).

A new leader keeps the HW it had as a follower, assigns its epoch at its log end in its epoch
cache (the caller stamps its appends with that epoch and persists the cache), and treats every
follower's position as unknown until it fetches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fabric.cluster.epochs import UNDEFINED, LeaderEpochCache
from fabric.cluster.partition import PartitionRecord
from fabric.errors import BadParameter, FabricError, FencedLeaderEpoch, NotLeader, OffsetOutOfRange

__all__ = ["FetchDecision", "FetchRequest", "FollowerReplica", "LeaderReplica"]


@dataclass(frozen=True, slots=True)
class FetchRequest:
    replica: str
    leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    delay_cursor: int = 0  # the follower holds the leader's delayed rows up to this id


@dataclass(frozen=True, slots=True)
class FetchDecision:
    """``error`` set: nothing else applies. ``diverging`` set: truncate and fetch again.
    Otherwise send batches from ``read_from``. ``high_watermark``: the leader's, always."""

    error: type[FabricError] | None
    diverging: tuple[int, int] | None
    read_from: int | None
    high_watermark: int
    message: str = ""


@dataclass(slots=True)
class _Position:
    """What the leader knows of one follower in this leader epoch."""

    end: int | None = None  # log end reported in this term; None until it fetches
    caught_up_ms: int | None = None  # last time it was caught up to the leader's log end
    prev_leader_end: int | None = None  # the leader's log end at its previous fetch
    prev_fetch_ms: int = 0
    delays: int | None = None  # delay cursor reported in this term; None until it fetches


def settle_isr_swap(
    old: PartitionRecord, new: PartitionRecord, stored: PartitionRecord | None
) -> tuple[PartitionRecord, bool]:
    """An ISR swap ``old`` -> ``new`` whose outcome was unknown (the store went away during it),
    settled by reading the store back: the ``(record, committed)`` to give
    ``LeaderReplica.on_isr_result``. ``new`` in the store: it went in. ``old`` still there, or
    the partition gone: it did not, and the proposal is dropped (the next ``isr_change`` may
    propose again). Anything else: news of a write that took its place."""
    if stored == new:
        return new, True
    if stored is None or stored == old:
        return new, False
    return stored, True


class LeaderReplica:
    def __init__(
        self,
        me: str,
        record: PartitionRecord,
        *,
        log_end: int,
        high_watermark: int,
        epochs: LeaderEpochCache,
        min_insync: int,
        lag_time_ms: int,
        now_ms: int,
    ) -> None:
        if record.leader != me:
            raise ValueError(f"{me!r} cannot lead: the partition record names {record.leader!r} as leader")
        if log_end < 0 or high_watermark < 0:
            raise ValueError(f"log_end ({log_end}) and high_watermark ({high_watermark}) must be >= 0")
        if min_insync < 1 or lag_time_ms <= 0:
            raise ValueError(f"min_insync ({min_insync}) must be >= 1 and lag_time_ms ({lag_time_ms}) > 0")
        if epochs.latest_epoch() > record.leader_epoch:
            raise FencedLeaderEpoch(
                f"{me!r} has batches of leader epoch {epochs.latest_epoch()}, newer than "
                f"the record's leader epoch {record.leader_epoch}"
            )
        self.me = me
        self.epochs = epochs
        self.min_insync = min_insync
        self.lag_time_ms = lag_time_ms
        self._record = record
        self._log_end = log_end
        self._hw = min(high_watermark, log_end)  # a HW past the log (unflushed tail lost) is clamped
        epochs.assign(record.leader_epoch, log_end)
        start = epochs.start_offset_for(record.leader_epoch)
        self._epoch_start = log_end if start is None else start
        self._pending: PartitionRecord | None = None
        self._active = True
        self._delays_end = 0  # the newest delayed row id this leader holds
        self._delay_hw = 0
        self._positions = {r: _Position() for r in record.replicas if r != me}
        for r in record.isr:
            if r != me:
                self._positions[r].caught_up_ms = now_ms  # lag_time_ms from now to show up

    # ---- reading

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def log_end(self) -> int:
        return self._log_end

    @property
    def leader_epoch(self) -> int:
        return self._record.leader_epoch

    @property
    def delays_end(self) -> int:
        """The newest delayed row id this leader holds (0: none yet)."""
        return self._delays_end

    @property
    def delay_high_watermark(self) -> int:
        """Every member of the (maximal) ISR holds the delayed rows up to this id."""
        return self._delay_hw

    @property
    def epoch_start(self) -> int:
        """The first offset of this leader epoch."""
        return self._epoch_start

    @property
    def record(self) -> PartitionRecord:
        """The committed record this leader works with."""
        return self._record

    @property
    def isr(self) -> tuple[str, ...]:
        """The committed ISR."""
        return self._record.isr

    @property
    def pending(self) -> PartitionRecord | None:
        """The ISR proposal in flight, if any."""
        return self._pending

    @property
    def active(self) -> bool:
        """False once a record or a failed swap showed that this replica no longer leads."""
        return self._active

    def follower_end(self, replica: str) -> int | None:
        """The log end ``replica`` reported in this leader epoch (None: not fetched yet)."""
        pos = self._positions.get(replica)
        return None if pos is None else pos.end

    def isr_behind(self) -> bool:
        """Whether an in-sync follower has not reported this leader's log end yet (it may fall
        out of the ISR with time alone, so the leader has to keep looking)."""
        end = self._log_end
        for r in self._record.isr:
            if r != self.me:
                pos = self._positions.get(r)
                if pos is None or pos.end is None or pos.end < end:
                    return True
        return False

    def not_enough_replicas(self) -> str | None:
        isr = self._record.isr
        if len(isr) < self.min_insync:
            return f"{len(isr)} in-sync replica(s) {list(isr)}, fewer than min_insync_replicas={self.min_insync}"
        return None

    def acked(self, end_offset: int) -> bool:
        """acks=all: every committed ISR member has the records below ``end_offset`` and the ISR
        is large enough."""
        return self._active and self._hw >= end_offset and self.not_enough_replicas() is None

    def delays_acked(self, row_id: int) -> bool:
        """acks=all for a delayed batch: every committed ISR member holds row ``row_id`` and the
        ISR is large enough."""
        return self._active and self._delay_hw >= row_id and self.not_enough_replicas() is None

    def on_delay_stored(self, row_id: int) -> None:
        """The leader stored delayed rows up to ``row_id`` (ids increase; a lower one is no news)."""
        if row_id > self._delays_end:
            self._delays_end = row_id
            self._advance_hw()

    # ---- events

    def on_append(self, end_offset: int, now_ms: int, waiting: Iterable[str] = ()) -> None:
        """The leader appended batches (stamped with its epoch); its log now ends at ``end_offset``.

        ``waiting``: the followers whose fetch is parked at this leader (long-polling for data).
        One that asked at the log end held everything the leader had until this append, so it
        was caught up now, however long its fetch had waited: an idle partition's fetch may wait
        longer than ``lag_time_ms``, and without this its first append would drop every follower
        from the ISR (and take it back a fetch later: two writes to the map per quiet partition)."""
        if end_offset < self._log_end:
            raise ValueError(f"leader log end cannot go back: {end_offset} < {self._log_end}")
        for r in waiting:
            pos = self._positions.get(r)
            if pos is not None and pos.end is not None and pos.end >= self._log_end:
                pos.caught_up_ms = now_ms
        self._log_end = end_offset
        self._advance_hw()

    def on_fetch(self, req: FetchRequest, now_ms: int) -> FetchDecision:
        epoch = self._record.leader_epoch
        if req.leader_epoch < epoch:
            return self._refuse(FencedLeaderEpoch, f"fetch with leader epoch {req.leader_epoch} < {epoch}")
        if req.leader_epoch > epoch or not self._active:
            return self._refuse(NotLeader, f"{self.me!r} does not lead epoch {req.leader_epoch}")
        pos = self._positions.get(req.replica)
        if pos is None:
            return self._refuse(BadParameter, f"{req.replica!r} is not a follower replica of this partition")
        if req.fetch_offset < 0:
            return self._refuse(BadParameter, f"fetch offset {req.fetch_offset} < 0")
        if req.last_fetched_epoch != UNDEFINED:
            e, end = self.epochs.end_offset_for(req.last_fetched_epoch, self._log_end)
            if e == UNDEFINED:  # the follower holds an epoch newer than any here: someone led after us
                return self._refuse(NotLeader, f"{req.replica!r} has leader epoch {req.last_fetched_epoch}")
            if e < req.last_fetched_epoch or end < req.fetch_offset:
                return FetchDecision(None, (e, end), None, self._hw)
        if req.fetch_offset > self._log_end:
            return self._refuse(OffsetOutOfRange, f"fetch offset {req.fetch_offset} > log end {self._log_end}")
        self._record_position(pos, req.fetch_offset, now_ms, req.delay_cursor)
        self._advance_hw()
        return FetchDecision(None, None, req.fetch_offset, self._hw)

    def isr_change(self, now_ms: int) -> PartitionRecord | None:
        """The next ISR proposal (shrink lagging members, add caught-up ones), or None."""
        if not self._active or self._pending is not None:
            return None
        isr = set(self._record.isr)
        keep = {r for r in isr if r == self.me or not self._lagging(r, now_ms)}
        add = {r for r, p in self._positions.items() if r not in isr and self._joins(p)}
        if keep | add == isr:
            return None
        self._pending = self._record.with_isr(keep | add)
        return self._pending

    def on_isr_result(self, record: PartitionRecord, committed: bool) -> bool:
        """The fate of a proposal, or any record seen in the store.

        ``committed=True``: ``record`` is in the store now (the proposal that was swapped in, or
        any newer record from a watch or a read); it becomes this leader's record when it names
        this leader and epoch, and deposes this leader for good otherwise. ``committed=False``:
        the swap of ``record`` definitely failed (an unknown outcome must be resolved by reading
        the store first); the proposal is dropped and the next ``isr_change`` may try again.
        Returns False when this replica no longer leads."""
        if not self._active:
            return False
        if not committed:
            if record == self._pending:
                self._pending = None
                self._advance_hw()
            return True
        if record.partition_epoch < self._record.partition_epoch:
            return True  # older news
        if record.leader != self.me or record.leader_epoch != self._record.leader_epoch:
            self._active = False
            self._pending = None
            return False
        if self._pending is not None and record.partition_epoch >= self._pending.partition_epoch:
            self._pending = None  # decided: ours went in, or another write took its place
        self._record = record
        for r in [r for r in self._positions if r not in record.replicas]:
            del self._positions[r]  # moved off this partition: no longer a follower to admit
        for r in record.replicas:
            if r != self.me:
                pos = self._positions.setdefault(r, _Position())
                if r in record.isr and pos.caught_up_ms is None:
                    pos.caught_up_ms = pos.prev_fetch_ms
        self._advance_hw()
        return True

    # ---- rules

    def _refuse(self, error: type[FabricError], message: str) -> FetchDecision:
        return FetchDecision(error, None, None, self._hw, message)

    def _record_position(self, pos: _Position, end: int, now_ms: int, delays: int = 0) -> None:
        if end >= self._log_end:
            pos.caught_up_ms = now_ms
        elif pos.prev_leader_end is not None and end >= pos.prev_leader_end:
            pos.caught_up_ms = max(pos.caught_up_ms or 0, pos.prev_fetch_ms)
        pos.end = end
        pos.delays = delays
        pos.prev_leader_end = self._log_end
        pos.prev_fetch_ms = now_ms

    def _lagging(self, replica: str, now_ms: int) -> bool:
        pos = self._positions[replica]
        if pos.end is not None and pos.end >= self._log_end:
            return False
        return pos.caught_up_ms is None or now_ms - pos.caught_up_ms > self.lag_time_ms

    def _joins(self, pos: _Position) -> bool:
        return (
            pos.end is not None
            and pos.end >= self._hw
            and pos.end >= self._epoch_start
            and pos.delays is not None
            and pos.delays >= self._delay_hw
        )

    def _hw_members(self) -> set[str]:
        """The maximal ISR: committed members plus those a pending proposal adds."""
        members = set(self._record.isr)
        if self._pending is not None:
            members |= set(self._pending.isr)
        return members

    def _advance_hw(self) -> None:
        ends, delays = [self._log_end], [self._delays_end]
        for r in self._hw_members():
            if r != self.me:
                pos = self._positions[r]
                if pos.end is None or pos.delays is None:
                    return  # not fetched in this term: its log end is unknown
                ends.append(pos.end)
                delays.append(pos.delays)
        self._hw = max(self._hw, min(ends))
        self._delay_hw = max(self._delay_hw, min(delays))


class FollowerReplica:
    def __init__(
        self,
        me: str,
        leader: str,
        leader_epoch: int,
        *,
        log_end: int,
        high_watermark: int,
        epochs: LeaderEpochCache,
    ) -> None:
        if leader == me:
            raise ValueError(f"{me!r} cannot follow itself")
        if log_end < 0 or high_watermark < 0:
            raise ValueError(f"log_end ({log_end}) and high_watermark ({high_watermark}) must be >= 0")
        if epochs.latest_epoch() > leader_epoch:
            raise FencedLeaderEpoch(
                f"{me!r} has batches of leader epoch {epochs.latest_epoch()}, newer than its leader's {leader_epoch}"
            )
        self.me = me
        self.leader = leader
        self.leader_epoch = leader_epoch
        self.epochs = epochs
        self._log_end = log_end
        self._hw = min(high_watermark, log_end)

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def log_end(self) -> int:
        return self._log_end

    def next_fetch(self) -> FetchRequest:
        return FetchRequest(self.me, self.leader_epoch, self._log_end, self.epochs.latest_epoch())

    def is_current(self, req: FetchRequest) -> bool:
        """Whether an answer to ``req`` still applies (nothing was appended or truncated since)."""
        return req == self.next_fetch()

    def on_diverging(self, epoch: int, end_offset: int) -> int:
        """The leader says our last epoch ends at ``end_offset`` in its log as ``epoch``: the offset
        to truncate to (Kafka's rule: the end of the largest epoch both logs know). The cache is
        truncated here too (idempotent); the caller truncates its log and persists the cache."""
        if epoch < 0 or end_offset < 0:
            raise ValueError(f"diverging epoch {epoch} and end offset {end_offset} must be >= 0")
        mine, my_end = self.epochs.end_offset_for(epoch, self._log_end)
        if mine == UNDEFINED:
            to = min(end_offset, self._log_end)
        elif mine != epoch:
            # we do not have the leader's epoch: cut to where our older epoch ends, then ask again
            to = min(my_end, self._log_end)
        else:
            to = min(my_end, end_offset, self._log_end)
        self._truncate(to)
        return to

    def on_appended(self, end_offset: int, batch_epochs: list[tuple[int, int]], leader_high_watermark: int) -> None:
        """The caller appended fetched batches ``[(epoch, base_offset)]`` (maybe none); the log now
        ends at ``end_offset``."""
        if end_offset < self._log_end:
            raise ValueError(f"follower log end cannot go back by appending: {end_offset} < {self._log_end}")
        last_epoch, last_base = self.epochs.latest_epoch(), self._log_end - 1
        for epoch, base in batch_epochs:  # check all before changing anything
            if not last_epoch <= epoch <= self.leader_epoch:
                raise ValueError(
                    f"fetched a batch of leader epoch {epoch}: not in [{last_epoch}, {self.leader_epoch}] "
                    f"(the previous batch's epoch and the leader's)"
                )
            if not last_base < base < end_offset:
                raise ValueError(f"batch base offset {base} not in ({last_base}, {end_offset}): out of order or range")
            last_epoch, last_base = epoch, base
        for epoch, base in batch_epochs:
            self.epochs.assign(epoch, base)
        self._log_end = end_offset
        self._hw = max(self._hw, min(leader_high_watermark, end_offset))

    def reset_to(self, start: int) -> None:
        """The leader's log starts at ``start``, past our log end: the caller emptied the log to
        start there (Kafka's ``truncateFullyAndStartAt``); every epoch goes (the next fetch asks
        with none, so no divergence check), and the high watermark is the new start."""
        if start <= self._log_end:
            raise ValueError(f"reset to {start}: not past the log end {self._log_end}")
        self.epochs.truncate_from_end(0)
        self._log_end = start
        self._hw = start

    def _truncate(self, to: int) -> None:
        self.epochs.truncate_from_end(to)
        self._log_end = to
        self._hw = min(self._hw, to)
