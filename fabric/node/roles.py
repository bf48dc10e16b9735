"""One partition's replication role on this node, as the cluster map last named it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fabric.cluster.epochs import LeaderEpochCache
from fabric.cluster.partition import PartitionRecord
from fabric.cluster.replica import FollowerReplica, LeaderReplica
from fabric.node.follower_fetches import FollowerFetch


@dataclass
class Role:
    """Leader (``leader`` set), follower (``follower`` and ``fetch`` set) or neither (named
    leader but not allowed to lead now, or a map older than the log): never both."""

    record: PartitionRecord
    epochs: LeaderEpochCache
    leader: LeaderReplica | None = None
    follower: FollowerReplica | None = None
    fetch: FollowerFetch | None = None  # follower: its fetching (fabric.node.follower_fetches)
    # leader: acks=all replies waiting for the high watermark: (end offset, client, reply frames,
    # when the append was durable here: time.monotonic_ns, for the ISR-wait timing)
    waiting: deque[tuple[int, bytes, list[Any], int]] = field(default_factory=deque)
    saved_hw: int = -1
    isr_proposed: bool = False
    # leader: delayed acks=all replies waiting for the delay high watermark: (row id, client, reply)
    delay_waiting: deque[tuple[int, bytes, list[Any]]] = field(default_factory=deque)
    delay_cursor: int = 0  # follower: it holds the leader's delayed rows up to this row id
