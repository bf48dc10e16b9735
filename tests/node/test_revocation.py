"""A revoked principal's subscriptions end on the node (Broker.end_revoked): the subscription is
told so by a PUSH event with status NOT_AUTHORIZED, nothing is pushed to it after, its leases go
back to its group and a stream group rebalances without it. In memory: a real Broker and Store,
no sockets (the real processes are in tests/integration/test_revocation.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fabric.errors import NotAuthorized
from fabric.node.broker import Broker
from fabric.protocol import frames as fr
from fabric.protocol.batch import encode_batch
from fabric.protocol.ops import Op
from fabric.settings import NodeConfig, QueueSettings
from fabric.store.flusher import Flusher
from fabric.store.store import Store

DAVE, ERIN = b"dave-conn", b"erin-conn"


class Node:
    def __init__(self, root: Path) -> None:
        self.store = Store(root, defaults=QueueSettings(), now_ms=0)
        self.sent: list[tuple[bytes, fr.Message]] = []
        self.broker = Broker(
            NodeConfig(node_id="n1", data_dir=str(root)),
            self.store,
            Flusher(lambda gen: None),
            lambda client, frames: self.sent.append((client, fr.decode([bytes(f) for f in frames]))) or True,
            now_ms=0,
        )
        self.rid = 0

    def request(self, client: bytes, op: Op, params: dict[str, Any], data: list[bytes] | None = None) -> fr.Message:
        self.rid += 1
        self.broker.handle(client, fr.encode(fr.Header(op, self.rid), params, data or []), 1)
        self.broker.deliver()
        replies = [m for c, m in self.sent if c == client and m.header.request_id == self.rid and m.header.flags]
        assert replies, f"no reply to {op.name}"
        assert not replies[-1].header.status, replies[-1].params
        return replies[-1]

    def take(self, client: bytes) -> list[fr.Message]:
        """Events sent to ``client`` since the last look."""
        self.broker.deliver()
        out = [m for c, m in self.sent if c == client and m.header.flags & fr.FLAG_EVENT]
        self.sent = [(c, m) for c, m in self.sent if c != client]
        return out


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path)
    n.broker.create_queue("jobs", QueueSettings(partitions=2, fsync="never"))
    yield n
    n.store.close()


def _subscribe(node: Node, client: bytes, kind: str, credit: int = 1000) -> int:
    params = {"queue": "jobs", "group": "g", "kind": kind, "credit_messages": credit, "start": "earliest"}
    return int(node.request(client, Op.SUBSCRIBE, params).params["subscription"])


def _produce(node: Node, p: int, n: int) -> None:
    node.request(DAVE + b"-producer", Op.PRODUCE, {"queue": "jobs", "partition": p}, [encode_batch([b"m"] * n)])


def _leased(events: list[fr.Message]) -> int:
    return sum(e - s for m in events if m.header.op == Op.PUSH for s, e, _ in m.params.get("leases") or [])


def test_a_revoked_queue_member_is_told_and_its_leases_go_to_the_others(node: Node) -> None:
    dave = _subscribe(node, DAVE, "queue", credit=4)
    _produce(node, 0, 10)
    assert _leased(node.take(DAVE)) == 4  # dave holds 4 leases, unacked
    _subscribe(node, ERIN, "queue")
    assert _leased(node.take(ERIN)) == 6

    node.broker.end_revoked([(DAVE, "dave")])
    [ended] = node.take(DAVE)
    assert ended.header.op == Op.PUSH and ended.header.request_id == dave
    assert ended.header.status == NotAuthorized.code
    assert ended.params["message"] == f"principal 'dave' was revoked: subscription {dave} on 'jobs' ended"
    assert dave not in node.broker.subs.by_id
    assert _leased(node.take(ERIN)) == 4  # dave's leases, at once (not after the visibility timeout)

    _produce(node, 1, 5)
    assert _leased(node.take(ERIN)) == 5
    assert node.take(DAVE) == []


def test_a_revoked_stream_member_leaves_its_group(node: Node) -> None:
    dave = _subscribe(node, DAVE, "stream")
    erin = _subscribe(node, ERIN, "stream")
    node.take(DAVE), node.take(ERIN)
    group = node.broker.streams.groups[("jobs", "g")]
    assert {group.owner(0), group.owner(1)} == {str(dave)}  # erin waits for dave's confirmation

    node.broker.end_revoked([(DAVE, "dave")])
    assert [m.header.status for m in node.take(DAVE)] == [NotAuthorized.code]
    assert {group.owner(0), group.owner(1)} == {str(erin)}
    assert [sorted(m.params["assigned"]) for m in node.take(ERIN) if m.header.op == Op.ASSIGNMENT] == [["0", "1"]]
    _produce(node, 0, 3)
    _produce(node, 1, 3)
    assert node.take(DAVE) == []
