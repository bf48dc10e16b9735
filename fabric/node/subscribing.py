"""SUBSCRIBE, CREDIT and UNSUBSCRIBE: a consumer's subscription to a queue starts, is granted
credit, ends. Stream groups, queue groups and key_shared groups are the broker's ``streams`` and
``shared``; a subscription outside a group reads the partitions it names from where it asks."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fabric.errors import (
    BadParameter,
    NotLeaseHolder,
    OffsetOutOfRange,
    StorageError,
    UnknownSubscription,
)
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op
from fabric.protocol.requests import (
    CreditParams,
    SettleParams,
    SubscribeParams,
    UnsubscribeParams,
)
from fabric.push.credit import Credit
from fabric.push.subscriptions import Subscription
from fabric.settings import QueueSettings

if TYPE_CHECKING:
    from fabric.node.broker import Broker

log = logging.getLogger("fabric.broker")


def subscribe(b: Broker, client: bytes, header: fr.Header, params: SubscribeParams, data: Sequence[Any]) -> dict | None:
    queue = params["queue"]
    b.placement.check_subscribe(queue, params)
    settings = b.store.settings(queue)
    _check_readable(b.store.partitions(queue), params["partitions"])
    limits = b.config.limits
    if len(b.subs.by_client.get(client, ())) >= limits.max_subscriptions_per_client:
        raise BadParameter(f"a client may hold {limits.max_subscriptions_per_client} subscriptions")
    timeout = params["session_timeout_ms"]
    if not limits.min_session_timeout_ms <= timeout <= limits.max_session_timeout_ms:
        raise BadParameter(
            f"session_timeout_ms {timeout} is outside this node's bounds {limits.min_session_timeout_ms}.."
            f"{limits.max_session_timeout_ms} ([limits] min_session_timeout_ms, max_session_timeout_ms)"
        )
    if (settings.mode == "direct") != (params["kind"] == "direct"):
        raise mode_mismatch(queue, settings.mode, "subscribe with kind='direct'")
    old = b.subs.by_id.get(params["replaces"]) if params["replaces"] is not None else None
    if old is not None and old.client != client and old.queue == queue and old.group == params["group"]:
        # the same consumer back over another link: its old subscription ends now (its group
        # rebalances at once) instead of holding partitions until its session expires
        log.info("subscription %d of %r replaced by its consumer's new link: it ends now", old.id, queue)
        b.subs.remove(old.id)
    reply = _subscribe_kind(b, client, params, settings)
    b.subs.by_id[reply["subscription"]].session_timeout_ms = timeout
    return reply


def mode_mismatch(queue: str, mode: str, what: str) -> BadParameter:
    if mode == "direct":
        exc = BadParameter(
            f"queue {queue!r} is a direct (brokerless) queue: producers send straight to its consumers; "
            f"{what} (the fabric client does)"
        )
    else:
        exc = BadParameter(f"queue {queue!r} is a log queue, not a direct one")
    exc.details = {"mode": mode}
    return exc


def _subscribe_kind(b: Broker, client: bytes, params: SubscribeParams, settings: QueueSettings) -> dict[str, Any]:
    queue = params["queue"]
    if params["kind"] == "direct":
        endpoint = params["endpoint"]
        if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://")):
            raise BadParameter("a direct subscription names the consumer's PULL endpoint: endpoint='tcp://HOST:PORT'")
        sub = Subscription(b.subs.new_id(), client, queue, None, {}, Credit(1, 1024), b._now_ms, kind="direct")
        b.subs.add(sub)
        b.subs.ready.discard(sub.id)  # nothing is ever pushed to it: producers send to the endpoint
        b.direct_endpoints.setdefault(queue, {})[sub.id] = endpoint
        return {"subscription": sub.id, "partitions": {}, "direct": True}
    if params["kind"] != "stream":
        return b.shared.subscribe(client, params, settings, b._now_ms)
    if params["group"] and params["partitions"] is None and params["offsets"] is None:
        return b.streams.subscribe(client, params, settings, b._now_ms)
    parts = params["partitions"]
    if parts is None:
        parts = list(range(settings.log_partitions))
    committed = b.store.meta.committed(queue, params["group"]) if params["group"] else {}
    start = params["start"]
    if start == "committed" and not params["group"]:
        start = "latest"
    resume = {int(k): v for k, v in (params["offsets"] or {}).items()}
    cursors = {}
    for p in parts:
        plog = b._partition(queue, p, settings)
        lo, hi = plog.log_start_offset, b.partitions[(queue, p)].visible
        if p in resume:  # a consumer picking up where it stood: clamp into the log
            cursors[p] = min(max(resume[p], lo), plog.next_offset)
        elif start == "earliest":
            cursors[p] = lo
        elif start == "latest":
            cursors[p] = hi
        elif start == "committed":
            cursors[p] = min(max(committed.get(p, lo), lo), plog.next_offset)
        elif isinstance(start, int) and lo <= start <= plog.next_offset:
            cursors[p] = start
        else:
            raise OffsetOutOfRange(f"start offset {start} is outside {lo}..{plog.next_offset} of {queue}/{p}")
    credit = Credit(params["credit_messages"], params["credit_bytes"])
    sub = Subscription(b.subs.new_id(), client, queue, params["group"], cursors, credit, b._now_ms)
    b.subs.add(sub)
    return {"subscription": sub.id, "partitions": {str(p): off for p, off in cursors.items()}}


def credit(b: Broker, client: bytes, header: fr.Header, params: CreditParams, data: Sequence[Any]) -> dict | None:
    sub = b.subs.by_id.get(params["subscription"])
    if sub is None or sub.client != client:
        raise UnknownSubscription(f"no subscription {params['subscription']} for this client")
    b.subs.grant(sub.id, params["messages"], params["bytes"])
    return {}


def unsubscribe(
    b: Broker, client: bytes, header: fr.Header, params: UnsubscribeParams, data: Sequence[Any]
) -> dict | None:
    sub = b.subs.by_id.get(params["subscription"])
    if sub is None or sub.client != client:
        raise UnknownSubscription(f"no subscription {params['subscription']} for this client")
    if params["keep_leases"] and sub.kind != "queue":
        raise BadParameter(f"keep_leases is for a 'queue' subscription; {sub.id} is {sub.kind!r}")
    released = 0
    if params["release"] and sub.shared is not None:
        # given back uncounted and in the same step as the member leaves, so that nothing is
        # pushed to it again in between
        nack = {"subscription": sub.id, "ranges": params["release"], "delay_ms": 0, "uncount": True}
        try:
            released = b.shared.settle(client, nack, "nack", b._now_ms)
        except NotLeaseHolder:
            pass  # expired meanwhile: already given back (counted, as any delivery that timed out)
    b.subs.remove(sub.id, keep_leases=params["keep_leases"])
    return {"released": released}


def _check_readable(logs: Sequence[Any], partitions: Sequence[int] | None) -> None:
    """SUBSCRIBE to a partition this node holds but refuses to read (an encrypted one whose key
    id the key file lacks): STORAGE_ERROR naming it, rather than a subscription that gets nothing."""
    for p, plog in enumerate(logs):
        if plog.refused and (not partitions or p in partitions):
            raise StorageError(f"partition {p} cannot be read: {plog.refused}")


def end_unreadable(b: Broker) -> None:
    """The subscriptions to a partition the pusher could not read end, each told why by a PUSH
    event with the error's status (the consumer raises it from poll, as FETCH does): a consumer
    must not take a partition it cannot read for an empty one."""
    unreadable, b.unreadable = b.unreadable, {}
    for (queue, p), exc in unreadable.items():
        for sub_id in sorted(b.subs.by_partition.get((queue, p), ())):
            sub = b.subs.remove(sub_id)
            if sub is not None:
                event = fr.Header(Op.PUSH, sub.id, fr.FLAG_EVENT, exc.code)
                message = f"{queue}/{p} cannot be read: {exc.message}"
                b._send_or_count(sub.client, fr.encode(event, {"error": exc.name, "message": message}))


def settle(b: Broker, client: bytes, header: fr.Header, params: SettleParams, data: Sequence[Any]) -> dict | None:
    """SETTLE: ack, nack or change the visibility of leases a queue member left behind (receipt
    handles), at the node that coordinates the queue's groups."""
    b.placement.check_coordinator(params["queue"])
    return {"settled": b.shared.settle_left(params, b._now_ms)}
