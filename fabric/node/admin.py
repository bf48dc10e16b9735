"""The broker's admin requests: queues (create, delete, alter, list, describe), the cluster map
(METADATA), ACLs, quotas, PING and CLUSTER_STATUS; and what DESCRIBE_QUEUE and LIST_QUEUES (and
the CLI's describe and group commands, and the metrics) report of a queue.

Each handler takes the broker and a request as ``Broker._handlers`` gives it; where a cluster
decides (the controller, etcd), the broker's placement (``fabric.node.placement``) takes the
request and the reply comes later."""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fabric import __version__
from fabric.errors import BadParameter, FabricError
from fabric.node.quotas import Quota
from fabric.protocol import frames as fr
from fabric.protocol.batch import HEADER_SIZE, decode_records, parse_header
from fabric.protocol.ops import INTERNAL_PREFIX, Op
from fabric.protocol.requests import (
    AclChangeParams,
    AclListParams,
    AlterQueueParams,
    CreateQueueParams,
    DeleteQueueParams,
    DescribeQueueParams,
    ListQueuesParams,
    MetadataParams,
    NoParams,
    PingParams,
    QuotaSetParams,
)
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.broker")
SETTINGS_PAGE_BYTES = 512 * 1024  # METADATA settings: a page's params stay well under the 1 MiB frame ceiling
SETTINGS_ENTRY_BYTES = 160  # a queue's entry there, not counting its name (about 110 bytes encoded)


def metadata(b: Broker, client: bytes, header: fr.Header, params: MetadataParams, data: Sequence[Any]) -> dict | None:
    """The cluster map as this node knows it (a single node: itself, leading everything)."""
    reply = b.placement.metadata(client, header, params, data)
    see = None if b.access is None else b.access.may_see(client)
    if see is not None:
        reply = {**reply, "queues": {q: v for q, v in reply["queues"].items() if see(q)}}
    return {**reply, **_producer_settings(b, client, params)} if params["settings"] else reply


def _producer_settings(b: Broker, client: bytes, params: MetadataParams) -> dict[str, Any]:
    """METADATA ``settings``: what a producer learns of a queue from DESCRIBE_QUEUE (partitions,
    size limits, priority levels, ordering, mode), for every queue this node holds that the
    client may produce to, in one reply: a producer sending to many queues asks once instead
    of one DESCRIBE_QUEUE round trip per queue. Held queues only (their settings are in the
    store); a queue missing here is described one by one, as before. Paged by name (from
    ``settings_from``, at most ``settings_limit`` queues and SETTINGS_PAGE_BYTES of params:
    the params frame has a 1 MiB ceiling); ``settings_next`` names the next page's first."""
    may = None if b.access is None else b.access.may_produce(client)
    out: dict[str, dict[str, Any]] = {}
    names = b.store.queue_names()
    start, limit = params["settings_from"], params["settings_limit"]
    size = 0
    for i in range(bisect.bisect_left(names, start) if start is not None else 0, len(names)):
        name = names[i]
        if name.startswith(INTERNAL_PREFIX) or (may is not None and not may(name)):
            continue
        size += len(name) + SETTINGS_ENTRY_BYTES
        if len(out) >= limit or size > SETTINGS_PAGE_BYTES:
            return {"settings": out, "settings_next": name}
        s = b.store.settings(name)
        out[name] = {
            "partitions": s.partitions,
            "max_message_bytes": s.max_message_bytes,
            "max_batch_bytes": s.max_batch_bytes,
            "priority_levels": s.priority_levels,
            "ordering": s.ordering,
            "mode": s.mode,
        }
    return {"settings": out, "settings_next": None}


def quota_set(b: Broker, client: bytes, header: fr.Header, params: QuotaSetParams, data: Sequence[Any]) -> dict | None:
    q = Quota.checked(params["target"], params["messages_per_s"], params["bytes_per_s"], params["burst_ms"])
    b.placement.set_quota(client, header, q)  # a cluster: etcd, raises Deferred
    b.quotas.set(q, b._now_ms)
    stored = [x for x in b.store.meta.quotas() if x.get("target") != q.target]
    b.store.meta.put_quotas([*stored, q.to_json()])  # 0/0 stored too: it overrides the config's
    log.info("quota %s: %d msg/s, %d B/s (burst %d ms)", q.target, q.messages_per_s, q.bytes_per_s, q.burst_ms)
    return {"quota": q.to_json()}


def quota_list(b: Broker, client: bytes, header: fr.Header, params: NoParams, data: Sequence[Any]) -> dict | None:
    return {
        "quotas": [q.to_json() for q in b.quotas.quotas.values()],
        "throttled_ms": dict(b.quotas.throttled_ms),
        "refused": dict(b.quotas.refused),
    }


def acl_list(b: Broker, client: bytes, header: fr.Header, params: AclListParams, data: Sequence[Any]) -> dict | None:
    if b.access is None:
        raise BadParameter("authentication is off on this node ([security] keys_dir): there are no ACLs")
    rules = [r.to_json() for r in b.access.acl.rules]
    if params["principal"] is not None:
        rules = [r for r in rules if r["principal"] == params["principal"]]
    return {"rules": rules, "admins": sorted(b.access.admins)}


def acl_change(
    b: Broker, client: bytes, header: fr.Header, params: AclChangeParams, data: Sequence[Any]
) -> dict | None:
    from fabric.security.acl import Rule

    if b.access is None:
        raise BadParameter("authentication is off on this node ([security] keys_dir): there are no ACLs")
    rule = Rule.checked(params["principal"], params["operation"], params["resource"])
    b.placement.change_acl(client, header, rule, header.op == Op.ACL_ADD)  # a cluster: etcd, Deferred
    acl = b.access.acl
    changed = acl.add(rule) if header.op == Op.ACL_ADD else acl.remove(rule)
    if changed:
        b.store.meta.put_acls([r.to_json() for r in acl.rules])
        log.info("ACL %s: %s", "added" if header.op == Op.ACL_ADD else "removed", rule.to_json())
    return {"changed": changed, "rules": len(acl.rules)}


def cluster_status(b: Broker, client: bytes, header: fr.Header, params: NoParams, data: Sequence[Any]) -> dict | None:
    b.placement.cluster_status(client, header)  # a cluster node reads etcd first: raises Deferred
    return None


def ping(b: Broker, client: bytes, header: fr.Header, params: PingParams, data: Sequence[Any]) -> dict | None:
    return {
        "node": b.config.node_id,
        "version": __version__,
        "time_ms": b._now_ms,
        "queues": len(b.store.queue_names()),
        "stats": dict(b.stats),
    }


def create_queue(
    b: Broker, client: bytes, header: fr.Header, params: CreateQueueParams, data: Sequence[Any]
) -> dict | None:
    name = params["name"]
    if name.startswith(INTERNAL_PREFIX):
        raise BadParameter(f"queue {name!r}: names starting with '__' are reserved for the node's own queues")
    base = b.config.queues.get(name, b.config.queue_defaults)
    settings = QueueSettings.from_dict(params["settings"], base=base, where=f"queue {name!r} settings")
    b.placement.queue_op(client, header, params, settings)  # a cluster: the controller, Deferred
    if params["if_not_exists"] and name in b.store.queue_names():
        return describe_queue(b, name)
    b.create_queue(name, settings)
    log.info("queue %r created: %d partition(s), fsync %s", name, settings.partitions, settings.fsync)
    return describe_queue(b, name)


def delete_queue(
    b: Broker, client: bytes, header: fr.Header, params: DeleteQueueParams, data: Sequence[Any]
) -> dict | None:
    name = params["name"]
    b.placement.queue_op(client, header, params, None)
    if params["if_exists"] and name not in b.store.queue_names():
        return {"deleted": False}
    b.drop_queue(name)
    return {"deleted": True}


def alter_queue(
    b: Broker, client: bytes, header: fr.Header, params: AlterQueueParams, data: Sequence[Any]
) -> dict | None:
    """ALTER_QUEUE: add partitions (a cluster: through the controller, which places them), or
    change settings that may change live (a cluster: the controller writes them to etcd)."""
    name, partitions, changes = params["name"], params["partitions"], params["settings"]
    if name.startswith(INTERNAL_PREFIX):
        raise BadParameter(f"queue {name!r}: the node's own queues are not altered")
    if (partitions is None) == (changes is None):
        raise BadParameter("ALTER_QUEUE takes either 'partitions' or 'settings'")
    if partitions is None:
        b.placement.alter_op(client, header, params)
        return _alter_settings(b, name, changes or {})
    before = b.store.settings(name).partitions if b.store.has_queue(name) else None
    b.placement.alter_op(client, header, params)
    b.store.settings(name)  # UNKNOWN_QUEUE
    b.grow_queue(name, partitions)
    log.info("queue %r altered: %d -> %d partition(s)", name, before, partitions)
    return {"name": name, "partitions": partitions, "added": partitions - (before or partitions)}


def _alter_settings(b: Broker, name: str, changes: dict[str, Any]) -> dict:
    before = b.store.settings(name).to_dict()
    after = b.store.alter_settings(name, changes).to_dict()
    changed = {k: [before[k], after[k]] for k in sorted(changes) if before[k] != after[k]}
    log.info("queue %r altered: %s", name, ", ".join(f"{k} {a!r} -> {v!r}" for k, (a, v) in changed.items()))
    return {"name": name, "settings": after, "changed": changed}


def list_queues(
    b: Broker, client: bytes, header: fr.Header, params: ListQueuesParams, data: Sequence[Any]
) -> dict | None:
    """LIST_QUEUES, one page by name (``from``, ``limit``, ``prefix``; ``next`` names the next
    page's first), so its params stay under the frame's 1 MiB ceiling however many queues
    there are. Of the other queues only the names are sorted; the page's own are summed up.
    A cluster node also lists the queues of the map it holds no replica of, in name order."""
    names = b.store.queue_names()
    mapped = b.placement.mapped_queues()
    if mapped:
        names = sorted(set(names).union(mapped))
    if b.access is not None and (see := b.access.may_see(client)) is not None:
        names = [q for q in names if see(q)]  # the queues it has no right on are not there for it
    page, after = list_page(names, params["from"], params["prefix"], params["limit"])
    out = []
    for name in page:
        if b.store.has_queue(name):
            out.append(queue_summary(b, name))
        else:
            out.append({"name": name, "partitions": len(mapped[name]), "messages": None, "size_bytes": None})
    return {"queues": out, "next": after}


def describe_queue_op(
    b: Broker, client: bytes, header: fr.Header, params: DescribeQueueParams, data: Sequence[Any]
) -> dict | None:
    name = params["name"]
    b.placement.describe_elsewhere(client, header, params, data)
    created = params["auto_create"] and not b.store.has_queue(name) and b.auto_create(name)
    d = describe_queue(b, name)
    return {**d, "created": True} if created else d


# ------------------------------------------------------------------ describing a queue

LIST_PAGE_BYTES = 512 * 1024  # LIST_QUEUES: a page's params stay well under the 1 MiB frame ceiling
LIST_ENTRY_BYTES = 100  # a queue's entry there, not counting its name (at most about 95 bytes encoded)


def describe_queue(
    broker: Broker,
    name: str,
    *,
    dead_letters: bool = True,
    brief: bool = False,
    group_names: list[str] | None = None,
) -> dict[str, Any]:
    """DESCRIBE_QUEUE: partitions, offsets, bytes on disk, every group (committed offsets, lag,
    members, leases) and the live subscriptions. ``brief`` (the metrics): without the settings,
    the subscriptions and the dead letters. ``group_names``: the queue's groups, when the caller
    read every queue's at once (``Metadata.groups_by_queue``; one ``groups`` a queue reads the
    group table each time)."""
    settings = broker.store.settings(name)
    parts: list[dict[str, Any]] = []
    for p in range(settings.log_partitions):
        plog = broker.store.partition(name, p)
        parts.append(  # one row per partition
            {
                "partition": p,
                "log_start_offset": plog.log_start_offset,
                "high_watermark": broker.visible(name, p, plog.next_offset),
                "next_offset": plog.next_offset,
                "messages": plog.next_offset - plog.log_start_offset,
                "size_bytes": plog.size_bytes,
                "segments": plog.segment_count,
                **({"refused": plog.refused} if plog.refused else {}),
            }
        )
    groups: dict[str, dict[str, Any]] = {}
    positions: dict[str, dict[str, int]] = {}  # stream groups: committed, else where the group starts
    names = broker.store.meta.groups(name) if group_names is None else group_names
    for group in sorted({*names, *broker.streams.describe(name)}):
        committed = broker.store.meta.committed(name, group)
        at = {  # what retention or a purge removed is not lag: it can no longer be read
            str(x["partition"]): max(
                committed.get(x["partition"], broker.streams.uncommitted_start(name, group, x)),
                x["log_start_offset"],
            )
            for x in parts
        }
        lag = {str(x["partition"]): max(0, x["high_watermark"] - at[str(x["partition"])]) for x in parts}
        positions[group] = at
        groups[group] = {
            "committed": {str(k): v for k, v in committed.items()},
            "lag": lag,
            "total_lag": sum(lag.values()),
        }
    subs = [] if brief else [s.describe() for s in broker.subs.by_id.values() if s.queue == name]
    hws = {x["partition"]: x["high_watermark"] for x in parts}
    for gname, info in broker.shared.describe(name, hws, broker._now_ms, saved=list(groups)).items():
        groups.setdefault(gname, {}).update(info)
    for gname, info in broker.streams.describe(name).items():
        groups.setdefault(gname, {}).update(info)
    now = broker._now_ms
    for gname, info in groups.items():
        # lag in seconds: how old the oldest message the group has not consumed (stream: committed
        # offset, else where the group starts, as its lag in messages counts; queue and key_shared:
        # oldest unsettled) is, by its batch's timestamp; 0 when caught up
        starts = info.get("floors") if info.get("kind") in ("queue", "key_shared") else positions.get(gname, {})
        ages = []
        for x in parts:
            at = (starts or {}).get(str(x["partition"]), x["log_start_offset"])
            ts = _timestamp_at(broker, name, x["partition"], at, x["high_watermark"])
            ages.append(max(0, now - ts) if ts is not None else 0)
        info["lag_seconds"] = round(max(ages, default=0) / 1000, 3)
        if info.get("kind") == "queue":
            info["oldest_unsettled_age_seconds"] = info["lag_seconds"]
    return {
        "name": name,
        "partitions": settings.partitions,
        # shrinking (docs/architecture.md "Shrinking"): the partitions that take writes; the others retire
        "live_partitions": broker.store.live_partitions(name),
        "priority_levels": settings.priority_levels,
        "encrypted": settings.encrypt,  # records encrypted at rest ([security] at_rest_key_file)
        "messages": sum(x["messages"] for x in parts),
        "delayed": broker.delayed.describe(name),
        "dead_letters": _dead_letters(broker, name, settings.dead_letter_queue or name + ".dlq")
        if dead_letters and not brief
        else None,
        "size_bytes": sum(x["size_bytes"] for x in parts),
        "settings": None if brief else settings.to_dict(),
        "partition_detail": parts,
        "groups": groups,
        **({"direct_consumers": broker.direct_consumers(name)} if settings.mode == "direct" else {}),
        "subscriptions": subs,
    }


def list_page(
    names: Sequence[str], start: str | None, prefix: str | None, limit: int, budget: int = LIST_PAGE_BYTES
) -> tuple[list[str], str | None]:
    """LIST_QUEUES' page of ``names`` (sorted): the names from ``start`` on that begin with
    ``prefix``, at most ``limit`` of them and about ``budget`` bytes of entries (however long the
    names, a page fits the params frame), and the name the next page starts at (None: the last
    page). A prefix's names are contiguous in name order, so the page is found by bisection and
    only its own names are looked at: a page costs the same wherever it is in the list."""
    prefix = prefix or ""
    page: list[str] = []
    size = 0
    for i in range(bisect.bisect_left(names, max(start or "", prefix)), len(names)):
        name = names[i]
        if not name.startswith(prefix):
            break
        size += len(name) + LIST_ENTRY_BYTES
        if page and (len(page) >= limit or size > budget):  # one name at least: a walk always ends
            return page, name
        page.append(name)
    return page, None


def queue_summary(broker: Broker, name: str) -> dict[str, Any]:
    """LIST_QUEUES' entry for a queue this node holds: DESCRIBE_QUEUE's name, partitions, messages
    and size_bytes, without the groups, subscriptions and timestamps a description reads (a
    page describes up to 5000 queues in one turn of the node's loop)."""
    settings = broker.store.settings(name)
    messages = size = 0
    for p in range(settings.log_partitions):
        plog = broker.store.partition(name, p)
        messages += plog.next_offset - plog.log_start_offset
        size += plog.size_bytes
    out: dict[str, Any] = {"name": name, "partitions": settings.partitions, "messages": messages, "size_bytes": size}
    if settings.dead_letter_queue:
        out["dead_letter_queue"] = settings.dead_letter_queue
    return out


def _timestamp_at(broker: Broker, queue: str, p: int, offset: int, upto: int) -> int | None:
    """The producer timestamp (ms) of the batch holding ``offset``, or None at or past ``upto``."""
    if offset >= upto:
        return None
    plog = broker.store.partition(queue, p)
    try:
        data = plog.read(max(offset, plog.log_start_offset), 1)
    except FabricError:
        return None
    if len(data) < HEADER_SIZE:
        return None
    return parse_header(data).first_timestamp


DLQ_SCAN_RECORDS = 100_000


def _dead_letters(broker: Broker, queue: str, dlq: str) -> dict[str, Any] | None:
    """The queue's DLQ: its size and how many of its messages came from ``queue`` for each reason.

    Reasons are read from the ``x-dlq-reason`` headers of the newest DLQ_SCAN_RECORDS
    messages per partition (``reasons_sampled`` says when the DLQ is longer)."""
    if dlq not in broker.store.queue_names() or dlq == queue:
        return None
    reasons: dict[str, int] = {}
    total = 0
    sampled = False
    for plog in broker.store.partitions(dlq):
        total += plog.next_offset - plog.log_start_offset
        offset = max(plog.log_start_offset, plog.next_offset - DLQ_SCAN_RECORDS)
        sampled |= offset > plog.log_start_offset
        try:
            for data, pos, _ in plog.batches(offset, plog.next_offset):
                for hdrs in decode_records(data, pos).headers or ():
                    if hdrs.get("x-dlq-source", b"").decode(errors="replace") == queue:
                        reason = hdrs.get("x-dlq-reason", b"unknown").decode(errors="replace")
                        reasons[reason] = reasons.get(reason, 0) + 1
        except FabricError:
            sampled = True
    return {"queue": dlq, "messages": total, "reasons": reasons, "reasons_sampled": sampled}
