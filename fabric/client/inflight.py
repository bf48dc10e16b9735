"""An idempotent producer's sequence bookkeeping for one partition: which batch may go, and what
a reply, a lost connection or a failure does to the ones behind it. Sans-IO: no sockets, no
clock (``now`` is passed in); the Producer maps the outcomes onto its queues.

Theory of operation (Kafka's idempotent producer, KIP-98 and KIP-360)
---------------------------------------------------------------------
A batch gets its sequence numbers when it is first sent, under the lane's identity (producer id,
epoch); the node stores a batch only if it starts exactly where the producer's previous stored
batch ended, and answers a batch it already has with that batch's offsets. So:

* **Order.** The numbered batches of a lane from its oldest unresolved one on form its *window*
  (at most ``limit``, the number of batches the node remembers per producer, so a retry of the
  oldest is still recognised however many after it the node has stored; and at most ``narrow``
  while any batch in it is small, below ``WIDE_BATCH_BYTES``: small batches are what a full
  window makes the producer gather into bigger ones, while big ones need a deep window to keep
  a durable node's disk busy during each fdatasync round trip). A batch is
  sent only when every batch before it in the window is in flight: a batch that must go again
  (lost with the connection, refused with a retriable error, waiting out its backoff) holds back
  everything numbered after it, and a new batch is numbered only behind a window that is wholly
  in flight. After a reconnect the window is therefore resent in sequence order before anything
  newer.
* **Out of order, predecessors pending.** A batch refused with ``OutOfOrderSequence`` while a
  batch before it is unresolved was only early (its predecessor was lost, or is being retried):
  it waits until each predecessor has been resolved or sent again, then goes again. No retry is
  counted.
* **A gap that cannot close.** ``OutOfOrderSequence`` for the oldest unresolved batch (nothing
  before it can still arrive: the node lost or forgot what came before) fails that batch, and
  any terminal failure of a numbered batch (retries or delivery time exhausted, a non-retriable
  error) leaves a hole in the sequence. Either way the lane *resets*: the identity is dropped;
  batches the node certainly did not store (refused, never lost) are unnumbered, to be numbered
  again from 0 under a new identity; batches whose fate is unknown (in flight, or lost with a
  connection) stay under the old identity and are resent until the node says stored (a
  duplicate's offsets) or not (``OutOfOrderSequence``: unnumbered and sent under the new
  identity). When none is left the lane asks for a new identity (``needs_identity``), and the
  Producer gets one from the node (a fresh producer id, or the next epoch of a named producer).
  Only the batch that failed reports an error; the others are stored once, under one identity
  or the other.

The per-batch state lives on the batch itself (``Entry`` below: the Producer's ``Batch`` has
these attributes), so the hot path pays for no extra objects.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

SEQUENCE_MOD = 2**31
WIDE_BATCH_BYTES = 64 * 1024  # a window of batches this big or bigger may be ``limit`` deep
Ident = tuple[int, int]  # (producer_id, epoch)

WAIT, RETRY, RENUMBER, FAIL, FAIL_GAP = "wait", "retry", "renumber", "fail", "fail_gap"


class Entry(Protocol):
    ident: Ident | None  # the identity it is numbered under; None: not numbered (yet, or again)
    sequence: int
    inflight: bool  # sent on the current connection, no reply yet
    unknown: bool  # an attempt's outcome is unknown (lost, timed out): it may be stored
    sent_no: int  # the lane's send counter at its last send
    refused_at: int  # the lane's send counter when it was refused as early (-1: not waiting)
    retry_at: float  # not before then (backoff after a retriable refusal)
    encoded: bytes | bytearray | None  # the bytes sent, sequence included: dropped when it is unnumbered
    nbytes: int  # its size (records and header): a window of small batches stays narrow
    settled: bool  # the node stored it (it stays in the window until those before it settle)


E = TypeVar("E", bound=Entry)


class Lane(Generic[E]):
    """The sequence state of one (queue, log partition) of an idempotent producer."""

    __slots__ = ("ident", "limit", "narrow", "next_sequence", "old", "sends", "window")

    def __init__(self, ident: Ident | None, limit: int = 16, narrow: int = 5) -> None:
        self.ident = ident  # None: reset, waiting for ``old`` to drain and a new identity
        self.limit = limit  # never more numbered and unresolved: what the node remembers
        self.narrow = min(narrow, limit)  # no more while any of them is small
        self.next_sequence = 0
        self.window: list[E] = []  # numbered under ``ident``, in sequence order, from the oldest unresolved
        self.old: list[E] = []  # numbered under an identity given up, fate unknown, in order
        self.sends = 0

    def __repr__(self) -> str:
        return f"Lane({self.ident}, next {self.next_sequence}, window {len(self.window)}, old {len(self.old)})"

    # ------------------------------------------------------------------ questions

    def _full(self) -> bool:
        """No new batch fits the window. Asked of the lane, never of the batch that would go, so
        every batch of the lane gets the same answer and none overtakes another."""
        w = self.window
        if len(w) < self.narrow:
            return False
        return len(w) >= self.limit or any(e.nbytes < WIDE_BATCH_BYTES for e in w)

    def room(self) -> bool:
        """A new batch could be numbered once the window is in flight (used to keep filling one)."""
        return self.ident is not None and not self._full()

    def may_number(self) -> bool:
        """A new batch may be numbered and sent now."""
        if self.ident is None or self._full():
            return False
        return all(e.inflight or e.settled for e in self.window)

    def may_send(self, b: E, now: float) -> bool:
        """``b`` (not in flight) may be sent now: numbered now, or a numbered batch whose
        predecessors are all in flight (sent again since it was refused as early)."""
        if b.retry_at > now:
            return False
        if b.ident is None:
            return self.may_number()
        for e in self.window if b.ident == self.ident else self.old:
            if e is b:
                return True
            if e.ident == b.ident and not e.settled and (not e.inflight or e.sent_no <= b.refused_at):
                return False
        return False  # not in this lane: resolved already

    def needs_identity(self) -> bool:
        return self.ident is None and not self.old

    def idle(self) -> bool:
        return not self.window and not self.old

    # ------------------------------------------------------------------ events

    def number(self, b: E, count: int) -> None:
        """Give ``b`` (``count`` records) the next sequence under the lane's identity (``may_number``)."""
        assert self.ident is not None
        b.ident = self.ident
        b.sequence = self.next_sequence
        b.settled = False
        b.unknown = False
        b.refused_at = -1
        self.next_sequence = (self.next_sequence + count) % SEQUENCE_MOD
        self.window.append(b)

    def take_back(self, b: E) -> None:
        """``b`` was just numbered but could not be sent (no connection): unnumber it, so the
        number goes to whatever is sent first."""
        if self.window and self.window[-1] is b and not b.sent_no:
            self.window.pop()
            self.next_sequence = b.sequence
            unnumber(b)

    def sent(self, b: E) -> None:
        self.sends += 1
        b.sent_no = self.sends
        b.inflight = True

    def acked(self, b: E) -> None:
        """The node stored ``b`` (now, or before: a duplicate's offsets)."""
        b.inflight = False
        b.settled = True
        if b.ident == self.ident:
            window = self.window
            while window and window[0].settled:  # the window starts at the oldest unresolved
                del window[0]
        else:
            self._remove(b)

    def lost(self, b: E) -> None:
        """No reply will come (the connection broke, or the request timed out): send it again."""
        b.inflight = False
        b.unknown = True

    def refused(self, b: E, out_of_order: bool, may_retry: bool, now: float, backoff: float) -> str:
        """The node refused ``b`` (it did not store it with this request). Returns what to do:
        WAIT (early: it goes again behind its predecessors), RETRY (after ``backoff``),
        RENUMBER (not stored under the identity given up: number it again), FAIL (give up: the
        lane resets if it was numbered under the current identity) or FAIL_GAP (the gap before
        it cannot close: fail it with that, the lane resets). Call ``failed`` for the last two."""
        b.inflight = False
        if out_of_order:
            if b.ident != self.ident:
                self._remove(b)
                unnumber(b)
                return RENUMBER
            for e in self.window:
                if e is b:
                    break
                if not e.settled:  # a predecessor is still unresolved: b was early
                    b.refused_at = self.sends
                    b.unknown = False
                    return WAIT
            return FAIL_GAP
        if may_retry:
            b.retry_at = now + backoff
            return RETRY
        return FAIL

    def failed(self, b: E) -> list[E]:
        """``b`` is given up (an error for its caller). A hole in the current identity's sequence
        resets the lane; returns the batches unnumbered by that, to be sent again in order."""
        b.inflight = False
        was_current = b.ident is not None and b.ident == self.ident
        self._remove(b)
        return self.reset() if was_current else []

    def forget(self, b: E) -> None:
        """``b`` leaves this lane unstored (its partition was retired by shrinking: it goes to
        another partition, numbered there). The lane's other batches are refused the same way."""
        b.inflight = False
        self._remove(b)
        unnumber(b)

    def reset(self) -> list[E]:
        """Give up the current identity (see the module docstring); the unnumbered batches."""
        again: list[E] = []
        for e in self.window:
            if e.settled:
                continue
            if e.inflight or e.unknown:
                self.old.append(e)  # perhaps stored: ask the node again under the old identity
            else:
                unnumber(e)
                again.append(e)
        self.window = []
        self.ident = None
        return again

    def adopt(self, ident: Ident) -> None:
        """A new identity for a lane that ``needs_identity``: sequences start again at 0."""
        assert self.needs_identity()
        self.ident = ident
        self.next_sequence = 0

    def _remove(self, b: E) -> None:
        for seq in (self.window, self.old):
            for i, e in enumerate(seq):
                if e is b:
                    del seq[i]
                    return


def unnumber(b: Entry) -> None:
    b.ident = None
    b.sequence = -1
    b.unknown = False
    b.refused_at = -1
    b.retry_at = 0.0
    b.sent_no = 0
    b.encoded = None
