"""A real `Broker` driven in memory: no sockets, no threads, a clock set by hand.

``BrokerHarness`` builds the broker as ``fabric.node.server.Server`` does (a real ``Store`` in a
temporary directory, a real ``Flusher``), but stands in for the server's event loop:

- requests are encoded with the real sans-IO codec (``fabric.protocol.frames``) and handed to
  ``Broker.handle`` as the ROUTER socket would hand them (routing id apart), so raw, broken
  frames can be fed in too (``send_frames``);
- the broker's send function records every message it sends, decoded, per client: replies by
  request id, events (PUSH, ASSIGNMENT) in order (``pushes``); a client in ``gone`` is one whose
  sends fail (its connection closed);
- after each request the harness takes one turn of the server's loop: ``Broker.tick(now)``,
  ``Broker.deliver()``, and the group commit on the loop's thread (``Flusher.sync_pending``, then
  ``Broker.on_synced``), so ``fsync = "always"`` queues behave as on a node;
- time moves only by ``advance(ms)``, which takes the loop's turns at the deadlines the broker
  asks for (``Broker.next_timeout_ms``), as the server's poll timeout does.

What it leaves out: the flusher's thread (every round is an inline one), the server's read-ahead
(``Broker.idle`` is always true: each request is the only one waiting), clusters and security.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from fabric.node.broker import Broker
from fabric.protocol import frames as fr
from fabric.protocol.batch import decode_records, encode_batch, iter_batches
from fabric.protocol.ops import Op
from fabric.settings import NodeConfig
from fabric.store.flusher import Flusher
from fabric.store.store import Store

START_MS = 1_700_000_000_000  # the clock's first reading: a plausible wall-clock time in ms
ALICE, BOB, CAROL = b"alice", b"bob", b"carol"  # client identities, as the ROUTER would name them


class BrokerHarness:
    def __init__(self, root: Path, config: NodeConfig | None = None, *, now_ms: int = START_MS) -> None:
        self.config = config or NodeConfig(node_id="n1", data_dir=str(root))
        self.now_ms = now_ms
        self.store = Store(
            root,
            defaults=self.config.queue_defaults,
            now_ms=now_ms,
            tail_cache_bytes=self.config.limits.tail_cache_bytes,
        )
        # never started: every group-commit round is an inline one, taken in _turn
        self.flusher = Flusher(lambda generation: None, inline_max_logs=1 << 30, inline_max_bytes=1 << 62)
        self.broker = Broker(self.config, self.store, self.flusher, self._record, now_ms=now_ms)
        self.broker.idle = lambda: True
        self.replies: dict[bytes, dict[int, fr.Message]] = defaultdict(dict)
        self.events: dict[bytes, list[fr.Message]] = defaultdict(list)
        self.gone: set[bytes] = set()
        self._request_id = 0

    def close(self) -> None:
        self.broker.close()
        self._sync()
        self.store.close(clean=True)

    # ------------------------------------------------------------------ requests

    def send(
        self,
        op: int,
        params: dict[str, Any] | bytes | None = None,
        data: list[bytes] | tuple[bytes, ...] = (),
        *,
        client: bytes = ALICE,
        flags: int = 0,
    ) -> int:
        """Hand one request to the broker (then one turn of the loop); its request id."""
        self._request_id += 1
        self.send_frames(fr.encode(fr.Header(op, self._request_id, flags), params, data), client=client)
        return self._request_id

    def send_frames(self, frames: list[Any], *, client: bytes = ALICE) -> None:
        """Any frames at all, as they came off the socket (after the routing id)."""
        self.broker.handle(client, frames, self.now_ms)
        self._turn()

    def reply(self, request_id: int, *, client: bytes = ALICE) -> fr.Message | None:
        """The reply to ``request_id`` (taken), or None when there is none yet."""
        return self.replies[client].pop(request_id, None)

    def request(
        self,
        op: int,
        params: dict[str, Any] | bytes | None = None,
        data: list[bytes] | tuple[bytes, ...] = (),
        *,
        client: bytes = ALICE,
        flags: int = 0,
    ) -> fr.Message:
        """A request answered at once: its reply, error or not."""
        request_id = self.send(op, params, data, client=client, flags=flags)
        reply = self.reply(request_id, client=client)
        assert reply is not None, f"no reply to {Op(op).name if op in Op._value2member_map_ else op}"
        return reply

    def call(
        self,
        op: int,
        params: dict[str, Any] | None = None,
        data: list[bytes] | tuple[bytes, ...] = (),
        *,
        client: bytes = ALICE,
    ) -> dict[str, Any]:
        """A request that must succeed: its reply's params."""
        reply = self.request(op, params, data, client=client)
        assert reply.header.status == 0, reply.params
        return reply.params

    def last_reply(self, client: bytes = ALICE) -> fr.Message:
        """The one reply ``client`` has waiting whatever its request id (a reply to frames the
        broker could not read a request id from)."""
        waiting = self.replies[client]
        assert len(waiting) == 1, waiting
        return waiting.pop(next(iter(waiting)))

    # ------------------------------------------------------------------ what was pushed

    def pushes(self, client: bytes = ALICE) -> list[fr.Message]:
        """The events (PUSH, ASSIGNMENT) sent to ``client`` since the last look, in order."""
        out, self.events[client] = self.events[client], []
        return out

    def pushed_values(self, client: bytes = ALICE) -> list[bytes]:
        """The record values of every PUSH sent to ``client`` since the last look, in order."""
        return [v for m in self.pushes(client) if m.header.op == Op.PUSH for _, v in records(m)]

    # ------------------------------------------------------------------ time

    def advance(self, ms: int) -> None:
        """Move the clock ``ms`` forward, taking the loop's turns at the broker's deadlines on
        the way (at least every ``TICK_MS``, as the server's poll timeout does)."""
        end = self.now_ms + ms
        while self.now_ms < end:
            step = self.broker.next_timeout_ms(self.now_ms)
            self.now_ms = min(end, self.now_ms + max(step, 1))
            self._turn()

    # ------------------------------------------------------------------ helpers

    def batch(self, *values: bytes, **kwargs: Any) -> bytes:
        """One record batch of ``values``, timestamped now (as a producer stamps it)."""
        kwargs.setdefault("first_timestamp", self.now_ms)
        return bytes(encode_batch(list(values), **kwargs))

    def produce(self, queue: str, *values: bytes, partition: int = 0, client: bytes = ALICE, **params: Any) -> dict:
        """PRODUCE one batch of ``values``; the reply's params (it must succeed)."""
        return self.call(
            Op.PRODUCE, {"queue": queue, "partition": partition, **params}, [self.batch(*values)], client=client
        )

    def create_queue(self, name: str, **settings: Any) -> dict:
        return self.call(Op.CREATE_QUEUE, {"name": name, "settings": settings})

    def describe(self, name: str) -> dict:
        return self.call(Op.DESCRIBE_QUEUE, {"name": name})

    # ------------------------------------------------------------------ the loop's part

    def _record(self, client: bytes, frames: list[Any]) -> bool:
        """The broker's send function: keep what it sent, decoded."""
        if client in self.gone:
            return False
        message = fr.decode([bytes(f) for f in frames])
        if message.header.flags & fr.FLAG_EVENT:
            self.events[client].append(message)
        else:
            assert message.header.flags & fr.FLAG_REPLY, message
            self.replies[client][message.header.request_id] = message
        return True

    def _turn(self) -> None:
        """What the server's loop does after the requests of a turn (fabric.node.server)."""
        self.broker.tick(self.now_ms)
        self.broker.deliver()
        self._sync()

    def _sync(self) -> None:
        result = self.flusher.sync_pending(self.flusher.completed)
        if result is None:
            return
        generation, failure = result
        if failure is None:
            self.broker.on_synced(generation)
        else:
            self.broker.on_sync_failed(generation)


def records(message: fr.Message) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in a PUSH or FETCH reply's data frames."""
    out = []
    for frame in message.data:
        for pos, h in iter_batches(frame):
            rec = decode_records(frame, pos)
            out.extend((h.base_offset + i, v) for i, v in enumerate(rec.values))
    return out


def values(message: fr.Message) -> list[bytes]:
    return [v for _, v in records(message)]
