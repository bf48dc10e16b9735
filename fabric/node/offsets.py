"""The broker's offset requests: COMMIT (a group's committed offsets, or with ``forget`` the
whole group), COMMITTED and LIST_OFFSETS.

Each handler takes the broker and a request as ``Broker._handlers`` gives it. A commit is
stored through ``Broker.commit_offsets`` (which a cluster's placement passes on to the other
nodes); LIST_OFFSETS is served at the partition's leader (a cluster passes it on there)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fabric.errors import BadParameter, NotLeaseHolder, OffsetOutOfRange
from fabric.protocol import frames as fr
from fabric.protocol.requests import CommitParams, CommittedParams, ListOffsetsParams
from fabric.settings import was_retired

if TYPE_CHECKING:
    from fabric.node.broker import Broker


def commit(b: Broker, client: bytes, header: fr.Header, params: CommitParams, data: Sequence[Any]) -> dict | None:
    queue = params["queue"]
    settings = b.store.settings(queue)
    if params["forget"]:
        return _forget_group(b, queue, params["group"], params["offsets"])
    offsets = {int(k): v for k, v in params["offsets"].items()}
    if b.config.cluster is None and settings.auto_partitions_max:
        # a commit to a partition that shrinking removed (a member's last one, sent as it was told) is dropped
        offsets = {p: off for p, off in offsets.items() if not was_retired(settings, p)}
    member = b.subs.by_id.get(params["subscription"]) if params["subscription"] else None
    for p, off in offsets.items():
        plog = b._partition(queue, p, settings)
        if (
            member is not None
            and member.kind == "stream"
            and member.group == params["group"]
            and (member.client != client or not b.streams.holds(member, p))
        ):
            raise NotLeaseHolder(f"partition {p} of {queue!r} is not held by this group member")
        if off > plog.next_offset:
            raise OffsetOutOfRange(f"cannot commit {off} past the end {plog.next_offset} of {queue}/{p}")
    b.commit_offsets(queue, params["group"], offsets)
    return {}


def _forget_group(b: Broker, queue: str, group: str, offsets: dict[str, int]) -> dict:
    """COMMIT ``forget``: delete a group, any kind: its committed offsets, its saved state
    (a queue group's leases) and the node's live copy of it, so ``group list`` no longer
    shows it. Refused while it has members, and for a group the queue does not have."""
    if offsets:
        raise BadParameter("COMMIT with forget takes no offsets")
    b.placement.check_forget_group()
    members = sum(1 for s in b.subs.by_id.values() if s.group == group and s.queue == queue)
    if members:
        raise BadParameter(f"group {group!r} of {queue!r} has {members} live member(s); stop them first")
    key = (queue, group)
    if key not in b.shared.groups and key not in b.streams.groups and group not in b.store.meta.groups(queue):
        raise BadParameter(f"queue {queue!r} has no group {group!r}")
    b.shared.forget_group(queue, group)
    b.streams.forget_group(queue, group)
    b.store.meta.delete_group(queue, group)
    return {}


def committed(b: Broker, client: bytes, header: fr.Header, params: CommittedParams, data: Sequence[Any]) -> dict | None:
    b.store.settings(params["queue"])
    offsets = b.store.meta.committed(params["queue"], params["group"])
    return {"offsets": {str(p): off for p, off in offsets.items()}}


def list_offsets(
    b: Broker, client: bytes, header: fr.Header, params: ListOffsetsParams, data: Sequence[Any]
) -> dict | None:
    b.placement.route(client, header, params, data)
    queue, p, at = params["queue"], params["partition"], params["at"]
    plog = b._partition(queue, p)
    upto = b.partitions[(queue, p)].visible
    if at == "earliest":
        offset = plog.log_start_offset
    elif at == "latest" or isinstance(at, str):  # admission lets no other word through
        offset = upto
    else:
        offset = min(plog.offset_for_timestamp(at), upto)
    return {
        "offset": offset,
        "log_start_offset": plog.log_start_offset,
        "high_watermark": upto,
        "log_end_offset": plog.next_offset,  # past the high watermark while a write awaits its replicas
        "sealed": b.store.settings(queue).sealed,  # a federation move's cut-over reads it here, at the leader
    }
