"""Requests this node passes on to another node, and the replies it relays back.

Theory of operation
-------------------
Any node is an entry point: a request for a partition this node does not lead is sent to the
leader over the DEALER the server keeps per peer, marked ``FLAG_FORWARDED`` so that it is never
passed on again, under a request id of this node's. The leader's reply comes back on that
socket and goes to the client as is, under the client's own request id.

Every forwarded request is answered: when the map names a new leader for a partition, or the
link to a peer is lost, the requests outstanding there get a retriable NOT_LEADER at once (the
producer resends instead of waiting out its timeout). Entries nobody answered are forgotten
after ``FORWARD_FORGET_MS`` (the client has timed out and retried long before).

A batch this node made itself (a dead letter for a partition led elsewhere) goes the same way
with acks=all; its ``done`` callback hears the leader's answer, or a timeout after
``INTERNAL_TIMEOUT_MS``.

Request ids come from the replication's one counter (``new_id``), shared with the follower's
fetches: the peer's replies arrive on one socket and are told apart by id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fabric.errors import FabricError, NotLeader, Timeout, error_for_code
from fabric.node.purgatory import Deferred
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op

FORWARD_FORGET_MS = 120_000
INTERNAL_TIMEOUT_MS = 10_000  # a batch this node sent to another leader (dead letters) is given up after this

PeerSend = Callable[[str, list[Any]], bool]  # (node id, frames) -> False if it could not be queued
SendFn = Callable[[bytes, list[Any]], Any]  # (client, frames): a reply to a client
ErrorFn = Callable[[bytes, fr.Header, Sequence[Any], FabricError], Any]  # an error reply to a client
Done = Callable[[FabricError | None], None]


class Forwarding:
    """Requests passed on to other nodes: id -> where the reply goes."""

    def __init__(
        self,
        node_id: str,
        send_peer: PeerSend,
        new_id: Callable[[], int],
        clock: Callable[[], int],
        send: SendFn,
        error: ErrorFn,
        endpoint_of: Callable[[str], str | None],
    ) -> None:
        self.node_id = node_id
        self.send_peer = send_peer
        self.new_id = new_id
        self.clock = clock
        self.send = send
        self.error = error
        self.endpoint_of = endpoint_of
        # requests passed on to the partition's leader: our request id -> (client, its header, when)
        self._forwarded: dict[int, tuple[bytes, fr.Header, int, str, str, int]] = {}
        # batches this node made and sent to a leader elsewhere: request id -> (done, sent at)
        self._internal: dict[int, tuple[Done, int]] = {}

    def pass_on(
        self,
        client: bytes,
        header: fr.Header,
        params: Mapping[str, Any],
        data: Sequence[Any],
        node: str,
        queue: str,
        p: int = -1,
    ) -> None:
        """Send a request to node ``node`` with FLAG_FORWARDED and raise Deferred; its reply goes
        back to ``client`` as is (``p`` -1: not tied to one partition's leader)."""
        rid = self.new_id()
        flags = (header.flags & fr.FLAG_NO_REPLY) | fr.FLAG_FORWARDED
        frames = [fr.Header(header.op, rid, flags).encode(), fr.encode_params(params), *data]
        if not self.send_peer(node, frames):
            endpoint = self.endpoint_of(node)
            where = f" at {endpoint}" if endpoint is not None else ""
            what = f"does not lead {queue}/{p}" if p >= 0 else f"does not hold {queue}"
            raise NotLeader(f"{self.node_id} {what} and cannot reach {node}{where}", try_elsewhere=True)
        if not header.flags & fr.FLAG_NO_REPLY:
            self._forwarded[rid] = (client, header, self.clock(), node, queue, p)
        raise Deferred

    def relay(self, frames: Sequence[Any]) -> bool:
        """A peer's reply to a request we passed on: back to the client with its request id."""
        if not self._forwarded or not frames:
            return False
        try:
            h = fr.decode_header(frames[0])
        except FabricError:
            return False
        entry = self._forwarded.pop(h.request_id, None)
        if entry is None:
            return False
        client, orig = entry[0], entry[1]
        out = fr.Header(orig.op, orig.request_id, fr.FLAG_REPLY, h.status).encode()
        self.send(client, [out, *frames[1:]])
        return True

    def on_leader_moved(self, queue: str, p: int, leader: str | None) -> None:
        """The map names a new leader for ``queue/p`` (or a peer is gone, ``queue`` ""): requests
        passed on to the old one will get no answer; tell their clients now (NOT_LEADER is
        retriable: the producer resends at once instead of waiting out its request timeout)."""
        lost = [
            rid
            for rid, e in self._forwarded.items()
            if (e[4] == queue and e[5] == p and e[3] != leader) or (not queue and e[3] == leader)
        ]
        for rid in lost:
            client, header, _, old, q, part = self._forwarded.pop(rid)
            self.error(client, header, (), NotLeader(f"{q}/{part}: its leader {old} is gone; retry"))

    def forget_old(self, now_ms: int) -> None:
        """Forget requests passed on more than FORWARD_FORGET_MS ago: the leader died with them
        (the clients time out and retry)."""
        if self._forwarded:
            old = [rid for rid, e in self._forwarded.items() if now_ms - e[2] > FORWARD_FORGET_MS]
            for rid in old:
                del self._forwarded[rid]

    # ------------------------------------------------------------------ batches this node made

    def send_internal(self, leader: str, queue: str, p: int, batch: bytes, done: Done) -> bool:
        """Send a batch this node made to ``leader`` with acks=all (False: it could not be queued)."""
        rid = self.new_id()
        params = {"queue": queue, "partition": p, "acks": "all"}
        frames = [fr.Header(Op.PRODUCE, rid, fr.FLAG_FORWARDED).encode(), fr.encode_params(params), batch]
        if not self.send_peer(leader, frames):
            return False
        self._internal[rid] = (done, self.clock())
        return True

    def internal_reply(self, frames: Sequence[Any]) -> bool:
        """A leader's answer to a batch this node sent: its ``done`` hears it."""
        if not self._internal:
            return False
        try:
            msg = fr.decode(list(frames))
        except FabricError:
            return False
        entry = self._internal.pop(msg.header.request_id, None)
        if entry is None:
            return False
        err = None
        if msg.header.status:
            err = error_for_code(msg.header.status, str(msg.params.get("message", "")))
        entry[0](err)
        return True

    def expire_internal(self, now_ms: int) -> None:
        """Batches sent to another leader with no answer within INTERNAL_TIMEOUT_MS: given up."""
        if self._internal:
            late = [rid for rid, (_, sent) in self._internal.items() if now_ms - sent > INTERNAL_TIMEOUT_MS]
            for rid in late:
                self._internal.pop(rid)[0](Timeout(f"no answer from the leader within {INTERNAL_TIMEOUT_MS} ms"))
