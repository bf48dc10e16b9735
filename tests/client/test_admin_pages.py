"""Admin.list_queues against a node from before paged LIST_QUEUES: that node refuses any param
(LIST_QUEUES had none) and answers with every queue and no ``next``, so the admin's first request
carries no params unless asked for a prefix or a page size."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import zmq

from fabric.client.admin import Admin
from fabric.errors import BadParameter
from fabric.protocol import frames as fr

QUEUES = [{"name": f"q{i}", "partitions": 1, "messages": 0, "size_bytes": 0} for i in range(3)]


def _old_node(router: zmq.Socket, asked: list[dict[str, Any]], stop: threading.Event) -> None:
    while not stop.is_set():
        if not router.poll(100):
            continue
        ident, *frames = router.recv_multipart()
        msg = fr.decode(frames)
        asked.append(msg.params)
        if msg.params:
            status = BadParameter.code
            params: dict[str, Any] = {
                "error": "BAD_PARAMETER",
                "message": f"LIST_QUEUES has no param {sorted(msg.params)[0]!r}",
            }
        else:
            status, params = 0, {"queues": QUEUES}
        router.send_multipart(
            [ident, *fr.encode(fr.Header(msg.header.op, msg.header.request_id, fr.FLAG_REPLY, status), params)]
        )


def test_a_node_from_before_paging_is_listed_whole_and_refuses_a_prefix() -> None:
    router = zmq.Context.instance().socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    asked: list[dict[str, Any]] = []
    stop = threading.Event()
    peer = threading.Thread(target=_old_node, args=(router, asked, stop), daemon=True)
    peer.start()
    try:
        with Admin(f"tcp://127.0.0.1:{port}", timeout_ms=5000) as admin:
            assert admin.list_queues() == QUEUES
            assert list(admin.iter_queues()) == QUEUES
            assert asked == [{}, {}]
            with pytest.raises(BadParameter, match="prefix"):
                admin.list_queues(prefix="q")
            with pytest.raises(BadParameter, match="limit"):
                list(admin.iter_queues(page=10))
    finally:
        stop.set()
        peer.join(5)
        router.close(0)
