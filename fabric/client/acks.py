"""A queue subscription's acks on their way to the node.

Acks are asynchronous: ``add`` gathers offset ranges per partition (adjacent ones merged); they
go in one ACK at most the ack interval late, or at once when ``ACK_BATCH_MAX`` ranges wait, sent
without waiting for the reply (``send``). What the node refuses of those comes back as replies
(``on_reply``), is counted in ``errors`` and kept until the next ``send_and_wait``, which sends
what is pending, waits for its reply (the node answers in order, so every earlier ACK is answered
by then) and raises NotLeaseHolder naming what was refused. A lost link drops what was not sent:
unacked messages are redelivered after their lease (at-least-once).
"""

from __future__ import annotations

import logging
import time

from fabric.client.messages import Message, ReceivedBatch, offset_ranges
from fabric.errors import ConnectionFailed, NotLeaseHolder
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from fabric.transport.connection import BaseConnection

log = logging.getLogger("fabric.consumer")
ACK_BATCH_MAX = 1000  # pending ack ranges that force a send before the interval
UNCONFIRMED_MAX = 10_000  # request ids of ACKs sent without waiting that are remembered
REFUSALS_KEPT = 100


class PendingAcks:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.ranges: dict[int, list[list[int]]] = {}  # pending ack ranges per partition
        self.pending = 0  # how many ranges
        self.next_send = 0.0  # monotonic time the oldest pending range is due to go (0: none pending)
        self.unconfirmed: set[int] = set()  # request ids of ACKs sent without waiting
        self.refusals: list[str] = []  # what the node refused of them, until send_and_wait reports it
        self.errors = 0

    def add(self, p: int, start: int, end: int) -> bool:
        """Gather [start, end) of partition ``p``; True when enough wait that they should go now."""
        ranges = self.ranges.setdefault(p, [])
        if ranges and ranges[-1][1] == start:
            ranges[-1][1] = end
        else:
            ranges.append([start, end])
            self.pending += 1
        if not self.next_send:
            self.next_send = time.monotonic() + self.interval_s
        return self.pending >= ACK_BATCH_MAX

    def _take(self) -> dict[str, list[list[int]]]:
        ranges = {str(p): rs for p, rs in self.ranges.items()}
        self.ranges, self.pending, self.next_send = {}, 0, 0.0
        return ranges

    def send(self, conn: BaseConnection, subscription: int) -> None:
        """Send what is pending without waiting (errors come back as replies and are counted)."""
        ranges = self._take()
        try:
            rid = conn.send(Op.ACK, {"subscription": subscription, "ranges": ranges}, timeout_ms=0)
            if len(self.unconfirmed) < UNCONFIRMED_MAX:
                self.unconfirmed.add(rid)
        except ConnectionFailed:
            pass  # unacked messages are redelivered after their lease: at-least-once

    def send_and_wait(self, conn: BaseConnection, subscription: int, *, durable: bool) -> None:
        """Send what is pending and wait for the reply; with ``durable`` also when nothing is
        pending but some were sent without waiting (an empty ACK is a barrier: replies come in
        order). Raises NotLeaseHolder if the node refused any ack since the last call."""
        if not self.ranges and not (durable and (self.unconfirmed or self.refusals)):
            return
        ranges = self._take()
        try:
            conn.request(Op.ACK, {"subscription": subscription, "ranges": ranges, "durable": durable})
        except NotLeaseHolder:
            self.errors += 1
            raise
        finally:
            for rid in list(self.unconfirmed):  # their replies came before this one
                reply = conn.take_reply(rid)
                if reply is not None:
                    self.on_reply(reply)
            self.unconfirmed.clear()
        refused, self.refusals = self.refusals, []
        if refused:
            raise NotLeaseHolder(f"{len(refused)} earlier ack(s) refused: {'; '.join(refused[:3])}")

    def nack(
        self, conn: BaseConnection, subscription: int, messages: Message | ReceivedBatch | list[Message], delay_ms: int
    ) -> int:
        """NACK ``messages`` (after sending the pending acks and waiting for their reply): given
        back for redelivery after ``delay_ms``; returns how many the node took back."""
        self.send_and_wait(conn, subscription, durable=False)
        reply = conn.request(
            Op.NACK, {"subscription": subscription, "ranges": offset_ranges(messages), "delay_ms": delay_ms}
        ).params
        return int(reply["nacked"])

    def on_reply(self, msg: fr.Message) -> None:
        self.unconfirmed.discard(msg.header.request_id)
        if msg.header.status:
            self.errors += 1
            text = str(msg.params.get("message", ""))
            log.warning("ack refused: %s", text)
            if len(self.refusals) < REFUSALS_KEPT:
                self.refusals.append(text)


def change_visibility(
    conn: BaseConnection, subscription: int, messages: Message | ReceivedBatch | list[Message], visibility_ms: int
) -> int:
    """CHANGE_VISIBILITY of ``messages``: leased ``visibility_ms`` more; returns how many changed."""
    reply = conn.request(
        Op.CHANGE_VISIBILITY,
        {"subscription": subscription, "ranges": offset_ranges(messages), "visibility_ms": visibility_ms},
    ).params
    return int(reply["changed"])
