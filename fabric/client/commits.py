"""A stream group member's commits on their way to the node.

``Consumer.commit()`` sends its COMMIT and returns without waiting for the reply: a consumer
that commits after every poll would otherwise hold the next push behind its commit's round trip
(docs/architecture.md, "The commit off the latency path"). The replies come back on the same
connection as the pushes, in order (the node answers a connection's requests in the order they
came), and are matched here (``on_reply``). A refusal is kept and raised by the next
``commit()`` (``raise_refused``), or logged by ``close()``. At most ``IN_FLIGHT_MAX`` commits wait
for a reply; the consumer waits for the oldest beyond that (``wait``). A lost link loses the
replies with it (``forget``): every commit carries every partition's position, so the next one
repeats what a lost one said, and a coordinated member commits again as it re-subscribes.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from fabric.errors import FabricError, Timeout
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from fabric.transport.connection import BaseConnection, raise_for_status

log = logging.getLogger("fabric.consumer")
IN_FLIGHT_MAX = 16  # commits sent and not yet answered before commit() waits for the oldest


class PendingCommits:
    def __init__(self) -> None:
        self.unanswered: deque[int] = deque()  # request ids of COMMITs sent, oldest first
        self.generation = 0  # the connection's link generation when the last of them went
        self.refused: FabricError | None = None  # the first refusal not yet raised

    def sent(self, request_id: int, generation: int) -> None:
        self.unanswered.append(request_id)
        self.generation = generation

    def on_reply(self, msg: fr.Message) -> bool:
        """A COMMIT reply: True if it answers one sent by ``commit()`` (refusals are kept)."""
        rid = msg.header.request_id
        if not self.unanswered or rid not in self.unanswered:
            return False
        if self.unanswered[0] == rid:
            self.unanswered.popleft()
        else:
            self.unanswered.remove(rid)
        if msg.header.status and self.refused is None:
            try:
                raise_for_status(msg)
            except FabricError as exc:
                self.refused = exc
        return True

    def raise_refused(self) -> None:
        """Raise the refusal of an earlier commit, once."""
        err, self.refused = self.refused, None
        if err is not None:
            raise err

    def forget(self) -> None:
        """The link was lost: no reply will come for what is unanswered."""
        self.unanswered.clear()

    def take_strays(self, conn: BaseConnection) -> None:
        """Replies that another request's wait read off the connection and set aside."""
        for rid in list(self.unanswered):
            reply = conn.take_reply(rid)
            if reply is not None:
                self.on_reply(reply)

    def wait(self, conn: BaseConnection, on_message: Callable[[fr.Message], None], left: int, timeout_ms: int) -> None:
        """Read the connection (every message goes to ``on_message``, which hands COMMIT replies
        back to ``on_reply``) until at most ``left`` commits are unanswered. Raises Timeout."""
        self.take_strays(conn)
        deadline = time.monotonic() + timeout_ms / 1000
        while len(self.unanswered) > left:
            if conn.generation() != self.generation:
                self.forget()
                return
            wait_ms = int((deadline - time.monotonic()) * 1000)
            if wait_ms <= 0:
                raise Timeout(f"no reply to {len(self.unanswered)} COMMIT(s) within {timeout_ms} ms")
            msg = conn.events.popleft() if conn.events else conn.recv(min(wait_ms, 100))
            if msg is not None:
                on_message(msg)

    def settle(self, conn: BaseConnection, on_message: Callable[[fr.Message], None], timeout_ms: int) -> None:
        """Closing: wait for the replies to commit()'s COMMITs; log a refusal nobody was told of."""
        try:
            self.wait(conn, on_message, 0, timeout_ms)
            self.raise_refused()
        except FabricError as exc:
            log.warning("commit refused: %s", exc.message)

    def make_room(self, conn: BaseConnection, on_message: Callable[[fr.Message], None], timeout_ms: int) -> None:
        """Before a COMMIT sent without waiting: wait for the oldest beyond IN_FLIGHT_MAX, and
        raise an earlier refusal."""
        if self.unanswered:
            self.take_strays(conn)
            if len(self.unanswered) >= IN_FLIGHT_MAX:
                self.wait(conn, on_message, IN_FLIGHT_MAX - 1, timeout_ms)
        self.raise_refused()

    def send(self, conn: BaseConnection, head: bytes, positions: dict[int, int], subscription: int | None) -> None:
        """Send a COMMIT of ``positions`` without waiting for its reply. ``head`` is the start of
        its params, ``{"queue":...,"group":...``; ``subscription`` a coordinated member's."""
        # what poll() returned (integer offsets): the params formatted directly, the same JSON
        # bytes as the general path's (a committing consumer sends one COMMIT per poll)
        pairs = b",".join(b'"%d":%d' % (p, o) for p, o in positions.items())
        tail = b',"subscription":%d}' % subscription if subscription is not None else b"}"
        rid = conn.send(Op.COMMIT, b'%s,"offsets":{%s}%s' % (head, pairs, tail))
        self.sent(rid, conn.sent_generation)
