"""When a producer's I/O thread must wake next: its linger, retry, timeout and backoff deadlines."""

from __future__ import annotations

from collections.abc import Callable

from fabric.client.recovery import Recovery
from fabric.client.sender import Sender
from fabric.client.sequencer import Sequencer

RETRY_S = 0.01  # how soon to retry sending while the node is unreachable


def next_deadline(
    now: float,
    seq: Sequencer,
    sender: Sender,
    recovery: Recovery,
    progress: Callable[[], tuple[int, ...]],
    *,
    linger_s: float,
    max_in_flight: int,
    request_timeout_s: float,
    delivery_timeout_s: float,
) -> int:
    """Lock held: ms until the next linger expiry, request timeout, send retry or backoff."""
    due = [b.created + linger_s for b in seq.open.values() if not b.eager]
    ready = seq.ready
    if ready and now < sender.throttle_until:
        due.append(sender.throttle_until)
    if ready and len(sender.inflight) < max_in_flight:
        if seq.next_sendable(now, progress()) is not None:
            due.append(now + RETRY_S)
        else:
            later = [b.retry_at for b in ready if b.retry_at > now]
            if later:
                due.append(min(later))
    if sender.conn.pending_output():
        due.append(now + RETRY_S)
    if sender.inflight:
        due.append(min(b.sent_at for b in sender.inflight.values()) + request_timeout_s)
    identity = recovery.next_deadline(now)
    if identity is not None:
        due.append(identity)
    if ready:
        due.append(min(b.created for b in ready) + delivery_timeout_s)
    if not due:
        return 1000
    return max(0, int((min(due) - now) * 1000) + 1)
