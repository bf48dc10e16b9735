"""The admin client: queues, offsets, node health. Synchronous request/reply.

A federation queue that lives on other clusters is answered QUEUE_ELSEWHERE by a federated
router (``fabric/client/federated.py``): the admin client asks again through the routers of the
cluster holding it (an inner Admin per cluster). For a queue split over several clusters,
``describe_queue`` merges each cluster's description of its share (partitions numbered globally,
plus ``federation``: the cluster of each partition), and the calls that name a partition
(``list_offsets``, ``fetch``, ``commit``, ``committed``) first learn where the queue lives (one
DESCRIBE_QUEUE per queue, remembered) and send each partition, as its local index, to its cluster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from fabric.client.federated import Placement
from fabric.client.handles import handle_ranges
from fabric.client.messages import ReceivedBatch, decode_chunk
from fabric.errors import BadParameter, NotLeader, QueueElsewhere
from fabric.protocol.frames import Message
from fabric.protocol.ops import SCHEMAS, Op
from fabric.transport.connection import connect

LIST_PAGE: int = SCHEMAS[Op.LIST_QUEUES]["limit"].default  # queues per LIST_QUEUES page, unless asked


class Admin:
    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout_ms: int = 10_000,
        fail_refused: bool = False,
        cluster: str | None = None,
    ) -> None:
        """``fail_refused``: fail a request at once when nothing listens at the endpoint (see
        :func:`fabric.transport.connection.connect`), rather than wait ``timeout_ms`` for a node.
        ``cluster``: the federation cluster whose share of a split queue this admin describes (the
        admin clients a federated one follows with)."""
        self._conn = connect(endpoint, timeout_ms=timeout_ms, fail_refused=fail_refused)
        self.endpoint = self._conn.endpoint
        self.timeout_ms = timeout_ms
        self._cluster = cluster
        self._placements: dict[str, Placement | None] = {}  # queue -> where it lives (None: here)
        self._clusters: dict[str, Admin] = {}  # federation cluster -> an admin through its routers

    def _call(self, op: Op, *, _resend: bool | None = None, **params: Any) -> dict[str, Any]:
        """One request's reply params (see ``_request``)."""
        return self._request(op, _resend=_resend, **params).params

    def _request(self, op: Op, *, _resend: bool | None = None, **params: Any) -> Message:
        """One request. NOT_LEADER (a router that has no way to the node yet, a node that is not the
        controller or leader this moment) says nothing was done, so it is retried, with backoff,
        until the admin's timeout; any other error is the caller's at once. A request lost with
        its link (a router or node gone) is sent again if it is safe to do twice (see
        ``Connection.request``; ``_resend`` overrides), else raises ConnectionFailed."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        pause = 0.05
        while True:
            try:
                return self._conn.request(op, params, resend=_resend)
            except QueueElsewhere as exc:
                placement = self._learn(exc)
                if placement.split:
                    raise BadParameter(
                        f"queue {placement.queue!r} is split over clusters {', '.join(placement.clusters)}: "
                        f"{op.name} names no partition of it (use describe_queue, or a call that names one)"
                    ) from None
                return self._at(placement.clusters[0], placement)._request(op, _resend=_resend, **params)
            except NotLeader:
                if time.monotonic() + pause >= deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    def ping(self, node: str | None = None) -> dict[str, Any]:
        """The node's id, version and counters. ``node``: through a router, ask that store (the
        reply's ``node`` says which answered: another one when the router has no way to it)."""
        return self._call(Op.PING) if node is None else self._call(Op.PING, node=node)

    def cluster_status(self) -> dict[str, Any]:
        """What ``fabric cluster status`` shows, as the node reached (through a router: the
        client's home store) reads it from etcd: cluster, revision, controller, nodes, routers,
        partitions, moves. A single node answers for itself (``cluster`` is None)."""
        msg = self._request(Op.CLUSTER_STATUS)
        partitions = json.loads(bytes(msg.data[0])) if msg.data else []
        out = {k: v for k, v in msg.params.items() if k not in ("partitions", "moves")}
        return {**out, "partitions": partitions, "moves": msg.params.get("moves", [])}

    def acl_list(self, principal: str | None = None) -> dict[str, Any]:
        """``{"rules": [{"principal", "operation", "resource"}], "admins": [...]}`` (needs admin on *)."""
        return self._call(Op.ACL_LIST, principal=principal)

    def acl_add(self, principal: str, operation: str, resource: str) -> bool:
        """Allow ``principal`` to ``operation`` (produce, consume, admin) on ``resource`` (a queue,
        a prefix ending in ``*``, or ``group:NAME``). False if the rule was there already."""
        return bool(self._call(Op.ACL_ADD, principal=principal, operation=operation, resource=resource)["changed"])

    def quota_set(
        self, target: str, *, messages_per_s: int = 0, bytes_per_s: int = 0, burst_ms: int = 1000
    ) -> dict[str, Any]:
        """Rate-limit ``queue:NAME`` or ``principal:NAME`` (0 and 0: remove the limit). Producers over
        it are slowed (their replies carry ``throttle_ms``), not failed."""
        return self._call(
            Op.QUOTA_SET, target=target, messages_per_s=messages_per_s, bytes_per_s=bytes_per_s, burst_ms=burst_ms
        )["quota"]

    def quota_list(self) -> dict[str, Any]:
        """``{"quotas": [...], "throttled_ms": {target: ms}, "refused": {target: n}}``."""
        return self._call(Op.QUOTA_LIST)

    def acl_remove(self, principal: str, operation: str, resource: str) -> bool:
        return bool(self._call(Op.ACL_REMOVE, principal=principal, operation=operation, resource=resource)["changed"])

    def create_queue(self, name: str, *, if_not_exists: bool = False, **settings: Any) -> dict[str, Any]:
        """Create a queue; ``settings`` are QueueSettings keys (partitions, fsync, retention_ms, ...)."""
        return self._call(
            Op.CREATE_QUEUE, _resend=if_not_exists or None, name=name, settings=settings, if_not_exists=if_not_exists
        )

    def delete_queue(self, name: str, *, if_exists: bool = False) -> bool:
        return bool(self._call(Op.DELETE_QUEUE, _resend=if_exists or None, name=name, if_exists=if_exists)["deleted"])

    def alter_queue(
        self, name: str, *, partitions: int | None = None, settings: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Grow queue ``name`` to ``partitions`` partitions (they are only ever added; returns
        ``{"name", "partitions", "added"}``), or change ``settings`` that may change on a live queue
        (retention_ms, max_messages, visibility_timeout_ms, ...; returns ``{"name", "settings",
        "changed": {key: [old, new]}}``). One of the two per call. Keys fixed at create
        (partitions, priority_levels, encrypt, mode, ordering, replication_factor, ...) raise
        BadParameter saying why. In a cluster every store holding the queue applies settings
        from its etcd watch, within moments of the reply."""
        if (partitions is None) == (settings is None):
            raise BadParameter("alter_queue takes either partitions or settings")
        if settings is not None:
            return self._call(Op.ALTER_QUEUE, name=name, settings=settings)
        return self._call(Op.ALTER_QUEUE, name=name, partitions=partitions)

    def metadata(self, queues: list[str] | None = None) -> dict[str, Any]:
        """The cluster map as this node knows it: ``{"cluster", "controller", "nodes": {id:
        endpoint}, "queues": {queue: [{"partition", "leader", "leader_epoch", "replicas",
        "isr"}, ...]}}`` (a single node answers ``{"cluster": false, ...}``)."""
        params: dict[str, Any] = {"queues": queues} if queues is not None else {}
        return self._call(Op.METADATA, **params)

    def list_queues(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """Every queue (``prefix``: those whose names start with it) as ``{"name", "partitions",
        "messages", "size_bytes"}``, sorted by name; read in pages, so any number of queues."""
        return list(self.iter_queues(prefix))

    def iter_queues(self, prefix: str | None = None, *, page: int = LIST_PAGE) -> Iterator[dict[str, Any]]:
        """The queues of :meth:`list_queues` one by one, asking for the next ``page`` (1..5000)
        only once the caller has taken the last. The first request carries only what differs
        from the defaults: without a prefix or another page size it carries none, and a node
        from before paged LIST_QUEUES (which refuses params it does not know) answers it with
        the whole list and no ``next``."""
        params: dict[str, Any] = {}
        if prefix is not None:
            params["prefix"] = prefix
        if page != LIST_PAGE:
            params["limit"] = page
        while True:
            reply = self._call(Op.LIST_QUEUES, **params)
            yield from reply["queues"]
            if reply.get("next") is None:
                return
            params = {**params, "from": reply["next"]}

    def describe_queue(self, name: str, *, auto_create: bool = False) -> dict[str, Any]:
        """The queue's description. ``auto_create``: as a producer's first look, the node creates
        a missing queue when its ``[node] auto_create_queues`` is on. A federation queue split
        over several clusters: each cluster's share described and merged (``federation``)."""
        params: dict[str, Any] = {"name": name}
        if auto_create:
            params["auto_create"] = True
        if self._cluster is not None:
            params["cluster"] = self._cluster
        try:
            reply = self._conn.request(Op.DESCRIBE_QUEUE, params).params
        except QueueElsewhere as exc:
            placement = self._learn(exc)
            if not placement.split:
                return self._at(placement.clusters[0], placement).describe_queue(name, auto_create=auto_create)
            return self._describe_split(placement)
        if self._cluster is None:
            self._placements.setdefault(name, None)
        return reply

    def _describe_split(self, placement: Placement) -> dict[str, Any]:
        shares = {c: self._at(c, placement).describe_queue(placement.queue) for c in placement.clusters}
        out = dict(shares[placement.clusters[0]])
        out["partitions"] = len(placement.partitions)
        for figure in ("messages", "size_bytes"):
            if all(isinstance(d.get(figure), int) for d in shares.values()):
                out[figure] = sum(d[figure] for d in shares.values())
        detail = []
        for c, d in shares.items():
            for row in d.get("partition_detail", []):
                detail.append({**row, "partition": placement.global_index(c, row["partition"]), "cluster": c})
        out["partition_detail"] = sorted(detail, key=lambda r: r["partition"])
        out["federation"] = {"partitions": list(placement.partitions), "clusters": list(placement.clusters)}
        return out

    def _learn(self, exc: QueueElsewhere) -> Placement:
        placement = Placement.from_details(exc.details)
        self._placements[placement.queue] = placement
        return placement

    def _at(self, cluster: str, placement: Placement) -> Admin:
        """The admin client that asks through ``cluster``'s routers."""
        admin = self._clusters.get(cluster)
        if admin is None:
            admin = self._clusters[cluster] = Admin(
                placement.endpoint(cluster), timeout_ms=self.timeout_ms, cluster=cluster
            )
        return admin

    def _where(self, queue: str, partition: int) -> tuple[Admin, int]:
        """The admin client that serves ``partition`` of ``queue`` and its index there."""
        if self._cluster is not None:
            return self, partition
        placement = self._placement_of(queue)
        if placement is None:
            return self, partition
        if not 0 <= partition < len(placement.partitions):
            raise BadParameter(f"queue {queue!r} has partitions 0..{len(placement.partitions) - 1}, not {partition}")
        cluster, local = placement.local(partition)
        return self._at(cluster, placement), local

    def list_offsets(self, queue: str, partition: int, at: str | int = "latest") -> dict[str, Any]:
        admin, local = self._where(queue, partition)
        reply = admin._call(Op.LIST_OFFSETS, queue=queue, partition=local, at=at)
        return {**reply, "partition": partition} if "partition" in reply else reply

    def fetch(
        self, queue: str, partition: int, offset: int, *, max_bytes: int = 1 << 20, wait_ms: int = 0
    ) -> tuple[list[ReceivedBatch], dict[str, Any]]:
        """Pull records from ``offset`` on without a subscription (FETCH): the records as column
        batches (the head of a batch before ``offset`` skipped) and the reply's watermarks
        (``high_watermark``, ``log_start_offset``). Long-polls up to ``wait_ms`` when there are none."""
        admin, local = self._where(queue, partition)
        params = {"queue": queue, "partition": local, "offset": offset, "max_bytes": max_bytes, "wait_ms": wait_ms}
        reply = admin._conn.request(Op.FETCH, params, timeout_ms=admin._conn.timeout_ms + wait_ms)
        out: list[ReceivedBatch] = []
        for chunk in reply.data:
            out.extend(decode_chunk(queue, partition, chunk, offset))
        return out, reply.params

    def fetch_raw(
        self, queue: str, partition: int, offset: int, *, max_bytes: int = 1 << 20, wait_ms: int = 0
    ) -> tuple[list[Any], dict[str, Any]]:
        """FETCH without decoding: the reply's record batches as stored (bytes-like chunks of whole
        batches laid end to end, the first possibly starting before ``offset``; not yet checked:
        ``fabric.protocol.batch.check_batch`` each) and its watermarks. For readers that decode the
        columns themselves (the Spark source builds Arrow arrays from them); otherwise ``fetch``."""
        params = {"queue": queue, "partition": partition, "offset": offset, "max_bytes": max_bytes, "wait_ms": wait_ms}
        reply = self._conn.request(Op.FETCH, params, timeout_ms=self._conn.timeout_ms + wait_ms)
        return list(reply.data), reply.params

    def committed(self, queue: str, group: str) -> dict[int, int]:
        placement = self._placement_of(queue)
        if placement is None:
            offsets = self._call(Op.COMMITTED, queue=queue, group=group)["offsets"]
            return {int(p): o for p, o in offsets.items()}
        out = {}
        for c in placement.clusters:
            for p, o in self._at(c, placement).committed(queue, group).items():
                out[placement.global_index(c, p)] = o
        return out

    def commit(self, queue: str, group: str, offsets: dict[int, int]) -> None:
        placement = self._placement_of(queue)
        if placement is None:
            self._call(Op.COMMIT, queue=queue, group=group, offsets={str(p): o for p, o in offsets.items()})
            return
        per: dict[str, dict[int, int]] = {}
        for p, o in offsets.items():
            if not 0 <= p < len(placement.partitions):
                raise BadParameter(f"queue {queue!r} has partitions 0..{len(placement.partitions) - 1}, not {p}")
            cluster, local = placement.local(p)
            per.setdefault(cluster, {})[local] = o
        for c, local_offsets in per.items():
            self._at(c, placement).commit(queue, group, local_offsets)

    def _placement_of(self, queue: str) -> Placement | None:
        """Where a queue lives (None: on the cluster this admin asks, as any queue); learnt once."""
        if self._cluster is None and queue not in self._placements:
            self.describe_queue(queue)
        return self._placements.get(queue)

    def purge_queue(self, name: str) -> dict[str, Any]:
        """Remove every message of queue ``name`` that consumers could see, keeping the queue, its
        settings and its groups (PURGE to each partition's leader): each log starts at its high
        watermark, groups have nothing left. Returns ``{"queue", "purged": n, "partitions": [{"partition",
        "purged", "log_start_offset"}, ...]}``."""
        detail = self.describe_queue(name)["partition_detail"]
        rows = [self._call(Op.PURGE, queue=name, partition=x["partition"]) for x in detail]
        parts = [{k: r[k] for k in ("partition", "purged", "log_start_offset")} for r in rows]
        return {"queue": name, "purged": sum(r["purged"] for r in rows), "partitions": parts}

    def settle(
        self,
        queue: str,
        group: str,
        handles: list[str],
        action: str = "ack",
        *,
        delay_ms: int = 0,
        visibility_ms: int = 0,
    ) -> int:
        """Settle messages of a queue group by receipt handle (``Consumer.receipt_handle``, printed by
        ``fabric recv --no-ack``) once their receiver has left keeping its leases: ``action`` "ack"
        (delete them), "nack" (redeliver after ``delay_ms``) or "visibility" (leased ``visibility_ms``
        more from now; 0 = redeliver now). Returns how many were settled; NotLeaseHolder names the
        handles whose lease had ended (another member may have them now), after settling the rest."""
        if action not in ("ack", "nack", "visibility"):
            raise BadParameter(f"action must be ack, nack or visibility, not {action!r}")
        done = 0
        for member, ranges in handle_ranges(handles).items():
            params: dict[str, Any] = {"queue": queue, "group": group, "member": member, "action": action}
            params["ranges"] = ranges
            if action == "nack":
                params["delay_ms"] = delay_ms
            elif action == "visibility":
                params["visibility_ms"] = visibility_ms
            done += int(self._call(Op.SETTLE, **params)["settled"])
        return done

    def delete_group(self, queue: str, group: str) -> None:
        """Delete a group of any kind (COMMIT ``forget``): its committed offsets, a queue group's
        leases, and its entry in ``groups``. Raises BadParameter while it has live members, or when
        the queue has no such group."""
        self._call(Op.COMMIT, queue=queue, group=group, offsets={}, forget=True)

    def groups(self, queue: str) -> dict[str, Any]:
        """Every consumer group of a queue: committed offsets, lag, members, and for queue groups
        backlog, in-flight count, oldest unsettled offsets."""
        return dict(self.describe_queue(queue)["groups"])

    def describe_group(self, queue: str, group: str) -> dict[str, Any]:
        groups = self.groups(queue)
        if group not in groups:
            from fabric.errors import UnknownMember

            raise UnknownMember(f"queue {queue!r} has no group {group!r}")
        return dict(groups[group])

    def reset_offsets(
        self, queue: str, group: str, to: str | int, *, partitions: list[int] | None = None, execute: bool = False
    ) -> dict[int, int]:
        """Move a group's committed offsets to ``earliest``, ``latest``, an offset, or ``{"timestamp": ms}``
        (``to`` as ``"ts:<ms>"``). A dry run unless ``execute``; returns the new offsets."""
        d = self.describe_queue(queue)
        info = d["groups"].get(group, {})
        if info.get("kind") == "queue":
            raise BadParameter(f"group {group!r} is a queue group: it settles messages by acks, not offsets")
        if info.get("members"):
            raise BadParameter(f"group {group!r} has live members; stop them before resetting its offsets")
        parts = partitions if partitions is not None else [x["partition"] for x in d["partition_detail"]]
        new = {}
        for p in parts:
            if to == "earliest" or to == "latest":
                new[p] = self.list_offsets(queue, p, to)["offset"]
            elif isinstance(to, str) and to.startswith("ts:"):
                new[p] = self.list_offsets(queue, p, int(to[3:]))["offset"]
            else:
                new[p] = int(to)
        if execute:
            self.commit(queue, group, new)
        return new

    def redrive(
        self, dlq: str, *, max_messages: int = 1_000_000, reason: str | None = None, dry_run: bool = False
    ) -> dict[str, int]:
        """Move dead letters back to the queues they came from."""
        return self._call(Op.REDRIVE, queue=dlq, max_messages=max_messages, reason=reason, dry_run=dry_run)

    def close(self) -> None:
        self._conn.close()
        for admin in self._clusters.values():
            admin.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
