"""The admin client retries NOT_LEADER (nothing was done: a router with no way to a node yet, a node
that is not the controller this moment) until its timeout, and no other error."""

from __future__ import annotations

import itertools
import threading
import time

import zmq

from fabric.client.admin import Admin
from fabric.errors import NotLeader, UnknownQueue
from fabric.protocol import frames as fr


def _peer(router: zmq.Socket, statuses: list[tuple[int, str]], seen: list[float], done: threading.Event) -> None:
    """Answer one request per status, (0, ""): a plain reply; stop when the client is done."""
    for status, error in statuses:
        waited = 0
        while not router.poll(50):
            waited += 50
            if done.is_set() or waited >= 5000:
                return
        ident, *frames = router.recv_multipart()
        seen.append(time.monotonic())
        header = fr.decode_header(frames[0])
        params = {"error": error, "message": f"{error}: test"} if status else {"pong": True}
        reply = fr.encode(fr.Header(header.op, header.request_id, fr.FLAG_REPLY, status), params)
        router.send_multipart([ident, *reply])


def _run(statuses: list[tuple[int, str]], timeout_ms: int) -> tuple[object, list[float]]:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    seen: list[float] = []
    done = threading.Event()
    peer = threading.Thread(target=_peer, args=(router, statuses, seen, done), daemon=True)
    peer.start()
    try:
        with Admin(f"tcp://127.0.0.1:{port}", timeout_ms=timeout_ms) as admin:
            try:
                result: object = admin.ping()
            except Exception as exc:
                result = exc
    finally:
        done.set()
        peer.join(6)
        router.close(0)
    return result, seen


def test_not_leader_is_retried_with_backoff_until_an_answer() -> None:
    result, seen = _run([(NotLeader.code, "NOT_LEADER")] * 3 + [(0, "")], 5000)
    assert result == {"pong": True}
    assert len(seen) == 4
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert gaps[0] >= 0.04 and gaps[2] >= 0.15  # 50 ms, then doubling


def test_not_leader_past_the_timeout_is_raised() -> None:
    result, seen = _run([(NotLeader.code, "NOT_LEADER")] * 20, 400)
    assert isinstance(result, NotLeader)
    assert 2 <= len(seen) <= 5


def test_other_errors_are_not_retried() -> None:
    result, seen = _run([(UnknownQueue.code, "UNKNOWN_QUEUE"), (0, "")], 5000)
    assert isinstance(result, UnknownQueue) and len(seen) == 1
