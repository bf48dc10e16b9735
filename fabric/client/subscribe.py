"""A consumer's SUBSCRIBE request: asked again until the group's coordinator answers.

In a cluster, a group is served by one node (its coordinator): a node that is not it answers
NOT_COORDINATOR naming it, and the consumer moves its connection there (keeping the endpoints
it was given to fail over to). A SUBSCRIBE with no answer within a third of the timeout is sent
again: the coordinator named may have died a moment ago (the map not changed yet), and a
connection that fails over to the next endpoint does not carry the request in flight with it.
NOT_LEADER (a router that reaches no storage node yet, a node not leading this moment) says
nothing was done: asked again with backoff until the timeout, as the admin client does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fabric.errors import ConnectionFailed, NotCoordinator, NotLeader, Timeout
from fabric.protocol.ops import Op
from fabric.transport.connection import BaseConnection, connect

log = logging.getLogger("fabric.consumer")


def request_subscribe(
    conn: BaseConnection,
    params: dict[str, Any],
    *,
    timeout_ms: int,
    heartbeat_ms: int,
    group: str | None,
    queue: str,
    moved: Callable[[BaseConnection], None],
) -> tuple[dict[str, Any], BaseConnection]:
    """SUBSCRIBE on ``conn``, retried as the module says; returns the reply's params and the
    connection that answered (a new one when NOT_COORDINATOR moved it: ``moved`` is told of it
    at once, so the caller holds the new connection even if a later attempt raises)."""
    deadline = time.monotonic() + timeout_ms / 1000
    attempt_ms = max(1000, timeout_ms // 3)
    pause = 0.05
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        try:
            return conn.request(Op.SUBSCRIBE, params, timeout_ms=max(1, min(attempt_ms, left_ms))).params, conn
        except (Timeout, ConnectionFailed) as exc:  # no answer, or the link lost with it in flight
            if time.monotonic() >= deadline or (isinstance(exc, ConnectionFailed) and not exc.details.get("in_flight")):
                raise
            log.info("no answer to SUBSCRIBE from %s: asking again", conn.current_endpoint())
        except NotLeader as exc:
            if time.monotonic() + pause >= deadline:
                raise
            log.info("SUBSCRIBE refused for now (%s): asking again", exc)
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
        except NotCoordinator as exc:
            target = exc.details.get("coordinator")
            if time.monotonic() > deadline:
                raise
            if isinstance(target, str) and target:
                given = [e for e in str(getattr(conn, "endpoint", "")).split(",") if e and e != target]
                log.info("group %r of %r is coordinated by %s: moving there", group, queue, target)
                conn.close()
                conn = connect(
                    ",".join([target, *given]),
                    timeout_ms=timeout_ms,
                    heartbeat_ms=heartbeat_ms,
                    spread=False,
                )
                moved(conn)
            else:
                time.sleep(0.2)  # no coordinator elected yet
