"""A node's DEALERs to its peers report their links: down at the start and when the peer goes
away, up after each handshake (real sockets on 127.0.0.1)."""

from __future__ import annotations

import time

import zmq

from fabric.transport.peers import Peers


def _pump(peers: Peers, poller: zmq.Poller, until, seconds: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peers.receive(dict(poller.poll(50)), lambda frames: None)
        if until():
            return True
    return False


def test_a_peer_link_is_reported_down_then_up_then_down_when_the_peer_goes() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    poller = zmq.Poller()
    peers = Peers(ctx, poller, identity=b"n1")
    seen: list[tuple[str, bool]] = []
    peers.on_link = lambda name, up: seen.append((name, up))
    try:
        peers.update({"n2": f"tcp://127.0.0.1:{port}"})
        assert seen == [("n2", False)]  # down until the handshake
        assert _pump(peers, poller, lambda: ("n2", True) in seen)
        assert peers.send("n2", [b"hello"])
        router.close(0)
        assert _pump(peers, poller, lambda: seen[-1] == ("n2", False))
        router = ctx.socket(zmq.ROUTER)
        router.bind(f"tcp://127.0.0.1:{port}")
        assert _pump(peers, poller, lambda: seen[-1] == ("n2", True))
    finally:
        peers.close()
        router.close(0)
        ctx.term()
