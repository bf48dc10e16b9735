"""One partition's replication role on this node, as the cluster map last named it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fabric.cluster.epochs import LeaderEpochCache
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.replica import FetchRequest, FollowerReplica, LeaderReplica

# an idle partition's fetch waits longer each round, up to this: thousands of idle partitions cost
# one fetch each per this long. A fetch lost with a broken link is sent again when the link is back
# (Peers' monitor), so the wait bounds only a loss nothing reported. REPLICA_FETCH's wait_ms is at
# most 60,000: a longer one would be refused by the nodes of a cluster not upgraded yet
FETCH_WAIT_IDLE_MAX_MS = 60_000


@dataclass
class Role:
    record: PartitionRecord
    epochs: LeaderEpochCache
    leader: LeaderReplica | None = None
    follower: FollowerReplica | None = None
    # leader: acks=all replies waiting for the high watermark: (end offset, client, reply frames)
    waiting: deque[tuple[int, bytes, list[Any]]] = field(default_factory=deque)
    fetch_sent_ms: int = -1  # follower: when the fetch in flight went out (-1: none in flight)
    fetch_id: int = 0
    fetch_req: FetchRequest | None = None  # follower: the fetch in flight (its answer applies only if current)
    saved_hw: int = -1
    retry_at_ms: int = 0  # follower: no fetch before then (after a refusal or an unreachable leader)
    isr_proposed: bool = False
    # leader: delayed acks=all replies waiting for the delay high watermark: (row id, client, reply)
    delay_waiting: deque[tuple[int, bytes, list[Any]]] = field(default_factory=deque)
    delay_cursor: int = 0  # follower: it holds the leader's delayed rows up to this row id
    # follower: how long its next fetch may wait at the leader. A new role starts idle (most of
    # thousands of partitions are): a busy one is down to FETCH_WAIT_MS within a few answers
    fetch_wait_ms: int = FETCH_WAIT_IDLE_MAX_MS
    sent_wait_ms: int = 0  # follower: the wait the fetch in flight carried (fetch_wait_ms, jittered)
    timer_due: int = 0  # follower: when its entry in the timer heap comes due (0: none)
    had_data: bool = False  # follower: the last answer brought records
