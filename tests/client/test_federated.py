"""The client side of the federation's front door, in memory: the placement a QUEUE_ELSEWHERE
reply carries, a producer's sends through other clusters (fake inner producers) and a split
queue's consumer (fake inner consumers): global numbering out, local numbering in."""

from __future__ import annotations

from typing import Any

import pytest

from fabric.client.batches import Batch, RecordFuture, RecordMetadata
from fabric.client.federated import Placement, ProducerLinks
from fabric.client.messages import Message
from fabric.client.split_consumer import SplitConsumer
from fabric.errors import BadParameter, ClusterUnavailable, ConnectionFailed, ProtocolError, QueueElsewhere
from fabric.protocol.batch import crc32c

DETAILS = {
    "queue": "orders",
    "partitions": ["west", "east", "west", "east", "west"],
    "routers": {"west": ["tcp://w:1", "tcp://w:2"], "east": ["tcp://e:1"]},
}


def test_a_placement_maps_global_partitions_to_each_cluster_and_back() -> None:
    pl = Placement.from_details(DETAILS)
    assert pl.clusters == ("west", "east") and pl.split
    assert [pl.local(p) for p in range(5)] == [("west", 0), ("east", 0), ("west", 1), ("east", 1), ("west", 2)]
    assert all(pl.global_index(*pl.local(p)) == p for p in range(5))
    assert pl.partitions_on("east") == [1, 3]
    assert pl.endpoint("west") == "tcp://w:1,tcp://w:2"
    whole = Placement.from_details({"queue": "q", "partitions": ["east"] * 3, "routers": {"east": []}})
    assert not whole.split and whole.local(2) == ("east", 2)
    with pytest.raises(ConnectionFailed, match="'east' holds partitions \\[0, 1, 2\\] and has no live router"):
        whole.endpoint("east")


@pytest.mark.parametrize(
    "bad",
    [
        {"partitions": ["a"], "routers": {}},
        {"queue": "q", "partitions": [], "routers": {}},
        {"queue": "q", "partitions": ["a", 3], "routers": {}},
        {"queue": "q", "partitions": ["a"], "routers": {"a": "tcp://x:1"}},
    ],
)
def test_a_bad_redirect_is_a_protocol_error(bad: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError, match="QUEUE_ELSEWHERE"):
        Placement.from_details(bad)


class FakeProducer:
    """What ProducerLinks asks of an inner producer; each send is finished at once, at offset 7."""

    def __init__(self, endpoint: str, cluster: str, limits: tuple[int, int, int, int] | None) -> None:
        self.endpoint, self.cluster, self.limits = endpoint, cluster, limits
        self.sent: list[dict[str, Any]] = []
        self.flushed = self.closed = 0
        self.moved_to: dict[str, Any] | None = None  # QUEUE_ELSEWHERE details its look-up would answer

    def _describe(self, queue: str) -> tuple[int, int, int, int]:
        if self.limits is None:
            raise ClusterUnavailable(f"cluster {self.cluster} has no live store")
        return self.limits

    def _send_general(self, queue: str, value: bytes, *args: Any) -> RecordFuture:
        if self.moved_to is not None:
            raise QueueElsewhere("moved", **self.moved_to)
        names = ("key", "headers", "partition", "timestamp_ms", "callback", "props", "dedup_id")
        kw = dict(zip(names, args, strict=True))
        self.sent.append({"value": value, **kw})
        local = kw["partition"] if kw["partition"] is not None else 0
        b = Batch(self, queue, local, 0.0, 1 << 20, 1 << 20)  # type: ignore[arg-type]
        b.values.append(value)
        b.offset, b.finished = 7, True
        if kw["callback"] is not None:
            kw["callback"](RecordMetadata(queue, local, 7), None)
        return RecordFuture(b, 0)

    def send(self, queue: str, value: bytes, *args: Any) -> RecordFuture:  # the plain fast path
        return self._send_general(queue, value, *args, None, "fast")

    def flush(self, timeout: float | None) -> None:
        self.flushed += 1

    def close(self, timeout: float | None) -> None:
        self.closed += 1


def links(limits: dict[str, tuple[int, int, int, int] | None]) -> tuple[ProducerLinks, dict[str, FakeProducer]]:
    made: dict[str, FakeProducer] = {}

    def make(endpoint: str, cluster: str) -> FakeProducer:
        made[cluster] = FakeProducer(endpoint, cluster, limits[cluster])
        return made[cluster]

    return ProducerLinks(make), made


def test_sends_hash_keys_over_every_global_partition_and_report_the_global_one() -> None:
    pl, made = links({"west": (3, 1000, 9000, 1), "east": (2, 800, 9500, 1)})
    queue, limits = pl.follow(DETAILS)
    assert queue == "orders" and limits == (5, 800, 9000, 1)  # every partition, the tightest limits
    assert made["west"].endpoint == "tcp://w:1,tcp://w:2" and made["east"].endpoint == "tcp://e:1"
    seen: list[RecordMetadata | None] = []
    for i in range(40):
        key = f"k{i}".encode()
        f = pl.send("orders", b"v", key, None, None, None, lambda md, err: seen.append(md), None, None)
        want = crc32c(key) % 5
        assert f.result().partition == want  # global, not the cluster's index
        assert seen[-1] is not None and seen[-1].partition == want
        cluster, local = Placement.from_details(DETAILS).local(want)
        assert made[cluster].sent[-1]["partition"] == local and made[cluster].sent[-1]["key"] == key
    # an explicit partition, and message properties carried over
    f = pl.send("orders", b"v", None, {"h": b"1"}, 3, 5, None, (None, None, 60_000, None), "d1")
    assert f.result().partition == 3
    last = made["east"].sent[-1]
    assert last["partition"] == 1 and last["props"] == (None, None, 60_000, None) and last["dedup_id"] == "d1"
    assert last["headers"] == {"h": b"1"}
    # unkeyed: the clusters in turn, each choosing its own sticky partition
    before = {c: len(p.sent) for c, p in made.items()}
    for _ in range(10):
        pl.send("orders", b"v", None, None, None, None, None, None, None)
    assert {c: len(p.sent) - before[c] for c, p in made.items()} == {"west": 5, "east": 5}
    assert all(s["partition"] is None for p in made.values() for s in p.sent[-5:])
    pl.flush(1)
    pl.close(1)
    assert all(p.flushed == 1 and p.closed == 1 for p in made.values())


def test_a_queue_wholly_elsewhere_keeps_its_numbering() -> None:
    pl, made = links({"east": (3, 1000, 9000, 2)})
    _, limits = pl.follow({"queue": "q", "partitions": ["east"] * 3, "routers": {"east": ["tcp://e:1"]}})
    assert limits == (3, 1000, 9000, 2)
    f = pl.send("q", b"v", b"key", None, None, None, None, None, None)
    # handed over whole: the cluster's producer hashes the key over the same 3 partitions
    assert type(f) is RecordFuture and made["east"].sent[-1]["key"] == b"key"
    assert made["east"].sent[-1]["partition"] is None
    pl.send("q", b"plain", None, None, None, None, None, None, None)
    assert made["east"].sent[-1]["dedup_id"] == "fast"  # a plain value takes the producer's fast path


def test_a_cluster_that_does_not_answer_is_left_out_and_none_answering_raises() -> None:
    pl, made = links({"west": (3, 1000, 9000, 1), "east": None})
    _, limits = pl.follow(DETAILS)
    assert limits == (5, 1000, 9000, 1)
    pl.send("orders", b"v", None, None, 0, None, None, None, None)
    assert made["west"].sent[-1]["partition"] == 0
    pl2, _ = links({"west": None, "east": None})
    with pytest.raises(ClusterUnavailable, match="no live store"):
        pl2.follow(DETAILS)
    assert "orders" not in pl2.queues


def test_a_queue_moved_away_from_a_cluster_is_followed_again() -> None:
    pl, made = links({"east": (3, 1000, 9000, 1), "north": (3, 1000, 9000, 1)})
    pl.follow({"queue": "q", "partitions": ["east"] * 3, "routers": {"east": ["tcp://e:1"]}})
    pl.send("q", b"1", None, None, 2, None, None, None, None)
    moved = {"queue": "q", "partitions": ["north"] * 3, "routers": {"north": ["tcp://n:1"]}}
    made["east"].moved_to = moved  # east's router now answers QUEUE_ELSEWHERE for q
    f = pl.send("q", b"2", None, None, 2, None, None, None, None)
    assert f.result().partition == 2 and made["north"].sent[-1]["value"] == b"2"
    assert pl.queues["q"].clusters == ("north",)
    made["north"].moved_to = moved  # a table that keeps pointing at a cluster that refuses: raised
    with pytest.raises(QueueElsewhere):
        pl.send("q", b"3", None, None, 2, None, None, None, None)


class FakeConsumer:
    def __init__(self, cluster: str, batches: list[list[Message]], assigned: list[int]) -> None:
        self.cluster, self.batches, self.assigned = cluster, batches, assigned
        self.acked: list[Message] = []
        self.commits: list[dict[int, int] | None] = []
        self.closed = False
        self.down = False

    def poll(self, timeout_ms: int = 1000) -> list[Message]:
        if self.down:
            raise ClusterUnavailable(f"cluster {self.cluster} has no live store")
        return self.batches.pop(0) if self.batches else []

    def assignment(self) -> list[int]:
        return self.assigned

    def ack(self, messages: list[Message], *, wait: bool = False) -> None:
        self.acked.extend(messages)

    def commit(self, offsets: dict[int, int] | None = None, *, wait: bool = False) -> None:
        self.commits.append(offsets)

    def committed(self) -> dict[int, int]:
        return {p: 10 + p for p in self.assigned}

    def close(self, *, keep_leases: bool = False) -> None:
        self.closed = True


def split_consumer(inner: dict[str, FakeConsumer]) -> SplitConsumer:
    c = SplitConsumer.__new__(SplitConsumer)
    c.queue, c._closed, c._turn, c._down = "orders", False, 0, {}
    c._placement = Placement.from_details(DETAILS)
    c._inner = inner  # type: ignore[assignment]
    return c


def test_a_split_consumer_merges_clusters_numbered_globally_and_settles_each_where_it_lives() -> None:
    west = FakeConsumer("west", [[Message("orders", 2, 5, b"w")]], [0, 1, 2])
    east = FakeConsumer("east", [[Message("orders", 1, 9, b"e")]], [0, 1])
    c = split_consumer({"west": west, "east": east})
    got = c.poll(0) + c.poll(0)
    assert sorted((m.value, m.partition, m.offset) for m in got) == [(b"e", 3, 9), (b"w", 4, 5)]
    assert c.poll(0) == []
    assert c.assignment() == [0, 1, 2, 3, 4]
    c.ack(got)
    assert [(m.value, m.partition) for m in west.acked] == [(b"w", 2)]
    assert [(m.value, m.partition) for m in east.acked] == [(b"e", 1)]
    c.commit({0: 3, 3: 4, 4: 8})
    assert west.commits == [{0: 3, 2: 8}] and east.commits == [{1: 4}]
    c.commit()
    assert west.commits[-1] is None and east.commits[-1] is None
    assert c.committed() == {0: 10, 2: 11, 4: 12, 1: 10, 3: 11}
    with pytest.raises(BadParameter, match=r"partitions 0\.\.4"):
        c.ack_offset(5, 0)
    c.close()
    assert west.closed and east.closed


def test_a_split_consumer_goes_on_with_the_clusters_that_have_stores() -> None:
    west = FakeConsumer("west", [], [0, 1, 2])
    east = FakeConsumer("east", [[Message("orders", 0, 1, b"e")]], [0, 1])
    west.down = True
    c = split_consumer({"west": west, "east": east})
    got = c.poll(50) + c.poll(50)
    assert [(m.value, m.partition) for m in got] == [(b"e", 1)]
    assert "west" in c._down  # asked again after DOWN_RETRY_S
    assert c.poll(30) == []  # nothing left; the lost cluster is not asked meanwhile


@pytest.mark.slow
def test_a_look_up_redirected_back_for_a_moment_is_asked_again() -> None:
    """A queue just moved from west to east: west's router names east, east's router, its directory a
    moment behind, still names west; the look-up through east is asked again until east agrees."""
    pl, _ = links({"east": (3, 1000, 9000, 1)})
    behind = {"n": 2}
    real = FakeProducer._describe

    def lagging(self: FakeProducer, queue: str) -> tuple[int, int, int, int]:
        if behind["n"]:
            behind["n"] -= 1
            raise QueueElsewhere("lives on west", queue=queue, partitions=["west"] * 3, routers={})
        return real(self, queue)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FakeProducer, "_describe", lagging)
        _, limits = pl.follow({"queue": "q", "partitions": ["east"] * 3, "routers": {"east": ["tcp://e:1"]}})
        assert limits == (3, 1000, 9000, 1) and behind["n"] == 0
        behind["n"] = 99  # a router that keeps redirecting back: raised, as before
        pl2, _ = links({"east": (3, 1000, 9000, 1)})
        with pytest.raises(QueueElsewhere):
            pl2.follow({"queue": "q", "partitions": ["east"] * 3, "routers": {"east": ["tcp://e:1"]}})
