"""What a router has sent on to each storage node and not yet seen answered. Pure bookkeeping: no
sockets, the time passed in.

Theory of operation
-------------------
Every request a router forwards that wants a reply is remembered under the node it went to, by
``(client id, request id)``, with its header (to build a refusal) and, for a request sent to the
leader of the partition it names, ``(queue, partition)``. The node's reply takes it out again (``answered``); a
reply for a request that is no longer remembered is one the router already refused on the
client's behalf, and the router drops it, so a client never sees two replies to one request.

A request is refused on the client's behalf, with a retriable error, in three cases, so that no
client waits out its ``request_timeout_ms`` for a reply that nobody will send:

* **the link to the node is lost** (``lost``: its connection closed, or ZeroMQ's heartbeats
  found the node silent, as a paused or cut-off process is): everything sent there;
* **the map moved a partition's leadership away from the node** (``moved``): the requests for
  that partition (the old leader may still be alive, and pass them on or refuse them itself: the
  client's resend is made safe by the idempotent producer, and the node's late reply is dropped);
* **it has waited longer than any client would** (``expired``): bookkeeping only, so that a node
  that swallows requests cannot grow the table without bound.

The table is bounded (``ENTRIES_MAX``): a router holding that many unanswered requests refuses
new ones as busy rather than forget old ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

ENTRIES_MAX = 500_000  # unanswered requests a router holds for all its nodes together
EXPIRE_S = 120.0  # longer than any client's request timeout: nobody waits for these any more

Key = tuple[bytes, int]  # (client id, request id)
Partition = tuple[str, int]


@dataclass(slots=True)
class Pending:
    """One forwarded request: enough to refuse it on the client's behalf."""

    header: bytes  # the request's 16-byte header as the client sent it
    partition: Partition | None  # the partition it names, when it went to that partition's leader
    sent_at: float  # monotonic seconds


@dataclass
class InFlight:
    """Forwarded requests per node, waiting for their replies."""

    by_node: dict[str, dict[Key, Pending]] = field(default_factory=dict)
    size: int = 0

    def full(self) -> bool:
        return self.size >= ENTRIES_MAX

    def sent(self, node: str, key: Key, header: bytes, partition: Partition | None, now: float) -> None:
        """A request went to ``node``."""
        table = self.by_node.get(node)
        if table is None:
            table = self.by_node[node] = {}
        if key not in table:
            self.size += 1
        table[key] = Pending(header, partition, now)

    def answered(self, node: str, key: Key) -> bool:
        """``node`` replied to this request: True when it was waiting (pass the reply on)."""
        table = self.by_node.get(node)
        if table is None or table.pop(key, None) is None:
            return False
        self.size -= 1
        return True

    def waiting(self, node: str) -> int:
        table = self.by_node.get(node)
        return 0 if table is None else len(table)

    def lost(self, node: str) -> list[tuple[Key, Pending]]:
        """The link to ``node`` is gone: every request sent there, removed."""
        table = self.by_node.pop(node, None)
        if not table:
            return []
        self.size -= len(table)
        return list(table.items())

    def moved(self, leader_of: Callable[[str, int], str | None]) -> list[tuple[str, Key, Pending]]:
        """The requests sent to a partition's leader that ``leader_of`` (the new map) no longer
        names as its leader, removed, each with the node it went to."""
        out: list[tuple[str, Key, Pending]] = []
        for node, table in self.by_node.items():
            gone = [(k, p) for k, p in table.items() if p.partition is not None and leader_of(*p.partition) != node]
            for k, p in gone:
                del table[k]
                out.append((node, k, p))
        self.size -= len(out)
        return out

    def expired(self, now: float, limit_s: float = EXPIRE_S) -> list[tuple[Key, Pending]]:
        """Requests waiting longer than ``limit_s``, removed."""
        out: list[tuple[Key, Pending]] = []
        for table in self.by_node.values():
            old = [(k, p) for k, p in table.items() if now - p.sent_at > limit_s]
            for k, _ in old:
                del table[k]
            out.extend(old)
        self.size -= len(out)
        return out
