"""Credit-based flow control for push delivery: pure arithmetic.

Theory of operation
-------------------
A consumer opens a subscription with a *window*: at most ``messages`` records and
``bytes`` bytes in flight. The server spends credit for every chunk it pushes
and the consumer grants it back (CREDIT) as it works through what it received.
The server sends a chunk of whole batches that fits the remaining credit, with
one exception that keeps a subscription from wedging (Kafka's rule, KIP-74): a
consumer with room for anything (credit above zero in both messages and bytes)
always receives at least the next whole batch, however large, alone. Credit may
then go below zero; the consumer's grants bring it back, and nothing more is sent
until they do. Grants can never raise credit above the window.

Why not "only when nothing is in flight": a consumer grants credit back in
quarter-window steps, so it may hold a grant below that step while the server
holds a batch larger than the credit left; neither side would move again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from fabric.protocol.batch import HEADER_SIZE, batch_span


@dataclass(slots=True)
class Credit:
    window_messages: int
    window_bytes: int
    messages: int = -1
    bytes: int = -1

    def __post_init__(self) -> None:
        if self.messages < 0:
            self.messages = self.window_messages
        if self.bytes < 0:
            self.bytes = self.window_bytes

    @property
    def idle(self) -> bool:
        """Nothing in flight: every credit granted has come back."""
        return self.messages == self.window_messages and self.bytes == self.window_bytes

    @property
    def has_room(self) -> bool:
        """Room for anything: the next whole batch may be sent, whatever its size."""
        return self.messages > 0 and self.bytes > 0

    @property
    def exhausted(self) -> bool:
        return self.messages <= 0 or self.bytes <= 0

    def spend(self, messages: int, nbytes: int) -> None:
        self.messages -= messages
        self.bytes -= nbytes

    def grant(self, messages: int, nbytes: int) -> None:
        self.messages = min(self.window_messages, self.messages + messages)
        self.bytes = min(self.window_bytes, self.bytes + nbytes)


class Chunk(NamedTuple):
    """A prefix of whole batches chosen to send (a tuple: one per push)."""

    nbytes: int
    records: int
    next_offset: int


def take(buf: bytes | memoryview, credit: Credit, upto_offset: int) -> Chunk | None:
    """Choose the longest prefix of the batches in ``buf`` that credit allows.

    Batches whose first offset is at or past ``upto_offset`` (the durable or high
    watermark) are not sent. Returns None when nothing may be sent now.
    """
    pos = records = 0
    nxt = -1
    messages, nbytes = credit.messages, credit.bytes
    end = len(buf)
    while end - pos >= HEADER_SIZE:
        base, size, count = batch_span(buf, pos)
        if base >= upto_offset or pos + size > end:
            break
        fits = records + count <= messages and pos + size <= nbytes
        if not fits and not (pos == 0 and credit.has_room):
            break
        pos += size
        records += count
        nxt = base + count
        if not fits:  # the first batch beyond the credit left goes alone
            break
    if pos == 0:
        return None
    return Chunk(pos, records, nxt)
