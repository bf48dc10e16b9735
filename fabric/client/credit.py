"""The consumer's side of credit flow control: when to give credit back. Pure arithmetic.

Theory of operation
-------------------
The node spends credit for every chunk it pushes: the records and bytes of the
whole batches it sent (a key_shared or queue member: the records leased to it and
the bytes of the batches carrying them). The consumer owes exactly that back, no
more and no less, whatever it skipped on arrival (the head of a batch before its
position, a push for a subscription it replaced), or the window leaks until it
wedges. It grants what it owes once the application has taken something and the
debt reaches a quarter of the window (fewer, larger grants keep the pipe full
without a message per message), or at once when forced (closing, re-subscribing).
And it never waits for a push while it owes a quarter: pushes read after a grant
(a poll gathering what arrived behind the batch it took) are paid before the
consumer blocks again, or a node out of credit and a consumer with nothing held
would wait on each other for good (a stream group member once wedged so).

That the node never waits on a grant below the quarter step is the node's rule
(:mod:`fabric.push.credit`): with any credit left it sends the next whole batch,
however large, so a consumer that has taken everything it was sent always owes
at least what it was last sent and is never starved below the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabric.protocol.batch import HEADER_SIZE, parse_header


@dataclass(slots=True)
class CreditDebt:
    """What a consumer owes the node, and when it pays."""

    window_messages: int
    window_bytes: int
    messages: int = 0
    bytes: int = 0

    def received(self, messages: int, nbytes: int) -> None:
        """A push arrived that the node counted as ``messages`` records and ``nbytes`` bytes."""
        self.messages += messages
        self.bytes += nbytes

    def due(self, *, force: bool = False) -> tuple[int, int] | None:
        """The grant to send now (and forget), or None while it is better to wait."""
        if not self.messages and not self.bytes:
            return None
        if force or self.messages * 4 >= self.window_messages or self.bytes * 4 >= self.window_bytes:
            grant = (self.messages, self.bytes)
            self.messages = self.bytes = 0
            return grant
        return None

    def forget(self) -> None:
        """A new subscription starts with a full window: nothing is owed any more."""
        self.messages = self.bytes = 0


def chunk_records(chunk: bytes | bytearray | memoryview) -> int:
    """Records in the whole batches laid end to end in ``chunk``: what the node spent on it."""
    pos = total = 0
    end = len(chunk)
    while end - pos >= HEADER_SIZE:
        h = parse_header(chunk, pos)
        total += h.record_count
        pos += h.size
    return total
