"""The ROUTER socket a node and a router take requests on, and the wake-up pair of their loops."""

from __future__ import annotations

from typing import Any

import pytest
import zmq

from fabric.errors import AddressInUse, ConfigError
from fabric.transport.front_door import authenticated_recv, bind_front_door
from fabric.transport.wakeup import drain, wake_pair


@pytest.fixture
def ctx():  # type: ignore[no-untyped-def]
    c: zmq.Context[Any] = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_a_front_door_binds_and_names_its_endpoint(ctx) -> None:  # type: ignore[no-untyped-def]
    sock, endpoint = bind_front_door(ctx, "tcp://127.0.0.1:0", max_message_bytes=1024, linger_ms=0)
    assert endpoint.startswith("tcp://127.0.0.1:") and not endpoint.endswith(":0")
    assert sock.getsockopt(zmq.MAXMSGSIZE) == 1024 and sock.getsockopt(zmq.LINGER) == 0
    with pytest.raises(AddressInUse, match=f"{endpoint} is in use"):  # a ConfigError too
        bind_front_door(ctx, endpoint, max_message_bytes=1024, linger_ms=0)
    with pytest.raises(ConfigError, match="cannot listen on tcp://"):
        bind_front_door(ctx, "tcp://256.0.0.1:1", max_message_bytes=1024, linger_ms=0)


def test_secure_runs_before_the_bind(ctx) -> None:  # type: ignore[no-untyped-def]
    seen: list[str] = []
    _, endpoint = bind_front_door(
        ctx,
        "tcp://127.0.0.1:0",
        max_message_bytes=1024,
        linger_ms=0,
        secure=lambda s: seen.append(s.getsockopt_string(zmq.LAST_ENDPOINT)),
    )
    assert seen == [""] and endpoint  # called before the bind


def test_a_connection_is_learnt_once_then_read_as_usual(ctx) -> None:  # type: ignore[no-untyped-def]
    sock, endpoint = bind_front_door(ctx, "tcp://127.0.0.1:0", max_message_bytes=1 << 20, linger_ms=0)
    principals: dict[bytes, str] = {}
    learnt: list[bytes] = []

    def learn(client: bytes, frame: zmq.Frame) -> None:
        learnt.append(client)
        principals[client] = "p"

    recv = authenticated_recv(sock, principals, learn)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    for n in range(2):
        dealer.send_multipart([b"h%d" % n, b"params"])
        assert sock.poll(5000)
        client, *rest = recv(0)
        assert rest == [b"h%d" % n, b"params"]
    assert learnt == [client]


def test_a_wake_up_is_drained(ctx) -> None:  # type: ignore[no-untyped-def]
    rx, tx = wake_pair(ctx, "test-wake")
    tx.send(b"")
    tx.send(b"")
    assert rx.poll(5000)
    drain(rx)
    assert not rx.poll(50)
