"""Random and mutated input at every port a node listens on (ZeroMQ ROUTER, the stream transport,
the metrics HTTP endpoint, and raw bytes at the ZeroMQ port): the node never crashes, answers every
well-framed request or closes the connection, keeps serving other clients, and loses nothing it
stored. Seeded; bounded in count and time."""

from __future__ import annotations

import json
import random
import socket
import struct
import time
import urllib.request

import pytest
import zmq

from fabric.client import Admin, Consumer, Producer
from fabric.protocol import frames as fr
from fabric.protocol.batch import encode_batch
from fabric.protocol.ops import Op

from ..conftest import JsonNode

pytestmark = pytest.mark.integration

SEED = 20261125
ROUNDS = 400  # per port
DEADLINE_S = 40.0  # per port


@pytest.fixture
def fuzz_node(tmp_path):
    node = JsonNode(tmp_path / "data", "--stream-listen", "fabric://127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
    info = node.info
    with Admin(info["endpoint"]) as admin:
        admin.create_queue("kept", partitions=2)
    with Producer(info["endpoint"]) as p:
        for i in range(100):
            p.send("kept", b"keep-%d" % i, key=b"k%d" % i)
        p.flush(10)
    try:
        yield info, node.proc
    finally:
        code = node.stop()
    # a request that reached a handler and raised something not a FabricError is a bug
    assert "internal error handling a request" not in node.stderr, node.stderr[-3000:]
    assert code == 0, node.stderr[-3000:]  # and it still stopped cleanly


def _valid_requests(rng: random.Random) -> list[list[bytes]]:
    """Well-formed requests of many ops (the material the mutator starts from)."""

    def req(op: Op, params: dict, *data: bytes, flags: int = 0) -> list[bytes]:
        header = fr.HEADER.pack(fr.MAGIC, fr.VERSION, op, flags, 0, 0, rng.randrange(1 << 40))
        return [header, json.dumps(params).encode(), *data]

    batch = encode_batch([b"fuzz-%d" % i for i in range(5)], keys=[b"a", None, b"c", None, b"e"])
    return [
        req(Op.PING, {}),
        req(Op.PRODUCE, {"queue": "fuzzq", "partition": 0, "acks": "leader"}, batch),
        req(Op.PRODUCE, {"queue": "kept", "partition": 1, "acks": "none"}, batch, flags=fr.FLAG_NO_REPLY),
        req(Op.FETCH, {"queue": "kept", "partition": 0, "offset": 0, "max_bytes": 65536}),
        req(Op.CREATE_QUEUE, {"name": f"fz{rng.randrange(50)}", "settings": {"partitions": 1}}),
        req(Op.DESCRIBE_QUEUE, {"name": "kept"}),
        req(Op.LIST_OFFSETS, {"queue": "kept", "partition": 0, "at": "latest"}),
        req(Op.COMMIT, {"queue": "kept", "group": "g", "offsets": {"0": 1}}),
        req(Op.SUBSCRIBE, {"queue": "kept", "group": "fz", "kind": "queue"}),
        req(Op.ACK, {"subscription": 1, "partition": 0, "ranges": [[0, 1]]}),
        req(Op.LIST_QUEUES, {}),
    ]


def _mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = [bytearray(f) for f in frames]
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(7)
        i = rng.randrange(len(frames))
        f = frames[i]
        if kind == 0 and f:  # flip bytes
            for _ in range(rng.randrange(1, 4)):
                f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
        elif kind == 1 and f:  # truncate
            del f[rng.randrange(len(f)) :]
        elif kind == 2:  # grow with junk
            f.extend(rng.randbytes(rng.randrange(1, 64)))
        elif kind == 3 and len(frames) > 1:  # drop a frame
            frames.pop(i)
        elif kind == 4:  # duplicate a frame
            frames.insert(i, bytearray(f))
        elif kind == 5 and len(f) >= 8:  # overwrite an integer field with an extreme value
            at = rng.randrange(len(f) - 7)
            f[at : at + 8] = struct.pack("<q", rng.choice([-1, 0, 2**63 - 1, -(2**63), 2**31]))
        else:  # JSON with the wrong types
            frames[i] = bytearray(json.dumps(rng.choice([[], 5, "x", None, {"queue": 7}, {"partition": "0"}])).encode())
    return [bytes(f) for f in frames]


def _random_frames(rng: random.Random, valid: list[list[bytes]]) -> list[bytes]:
    if rng.random() < 0.7:
        return _mutate(rng, rng.choice(valid))
    return [rng.randbytes(rng.randrange(0, 40)) for _ in range(rng.randrange(1, 5))]


def _intact(info: dict) -> None:
    """The node still serves a new client, and what it stored before is all there."""
    with Admin(info["endpoint"], timeout_ms=5000) as admin:
        assert admin.ping()["node"]
        parts = admin.describe_queue("kept")["partition_detail"]
    assert sum(p["next_offset"] for p in parts) >= 100
    got = set()
    with Consumer("kept", info["endpoint"], start="earliest", group=None) as c:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not {b"keep-%d" % i for i in range(100)} <= got:
            got.update(m.value for m in c.poll(200))
    assert {b"keep-%d" % i for i in range(100)} <= got


def test_fuzz_zeromq_port(fuzz_node):
    info, proc = fuzz_node
    rng = random.Random(SEED)
    valid = _valid_requests(rng)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(info["endpoint"])
    deadline = time.monotonic() + DEADLINE_S
    answered = sent = 0
    try:
        for _ in range(ROUNDS):
            if time.monotonic() > deadline:
                break
            sock.send_multipart(_random_frames(rng, valid))
            sent += 1
            while sock.poll(20):
                reply = sock.recv_multipart()
                answered += 1
                if len(reply) >= 1 and len(reply[0]) == fr.HEADER.size:
                    # a mutated FLAG_ROUTED request is answered as a router would be: the flag
                    # stays on the reply, and the frame after the header is the "client" id
                    flags = reply[0][4]
                    assert reply[0][:2] == fr.MAGIC and flags & (fr.FLAG_REPLY | fr.FLAG_EVENT), reply[0]
        assert proc.poll() is None, "the node died"
        while sock.poll(500):
            sock.recv_multipart()
            answered += 1
    finally:
        sock.close(0)
    assert answered > sent // 2  # most inputs get an answer (NO_REPLY and acks=none get none)
    _intact(info)


def test_fuzz_stream_transport_port(fuzz_node):
    info, proc = fuzz_node
    host, port = info["stream_endpoint"].removeprefix("fabric://").rsplit(":", 1)
    rng = random.Random(SEED + 1)
    valid = _valid_requests(rng)
    greeting = b"FABRIC\x01\x00"
    deadline = time.monotonic() + DEADLINE_S
    closed = answered = 0
    for _ in range(ROUNDS // 4):
        if time.monotonic() > deadline:
            break
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.settimeout(0.3)
            choice = rng.randrange(4)
            if choice == 0:  # handshake garbage
                payload = rng.randbytes(rng.randrange(1, 64))
            elif choice == 1:  # a good greeting, then a broken envelope (lengths that do not add up, huge)
                payload = greeting + struct.pack("<IH", rng.choice([0, 1, 0xFFFFFFFF, 7]), rng.randrange(0, 5))
                payload += rng.randbytes(rng.randrange(0, 30))
            else:  # a good greeting and envelopes around mutated requests
                payload = greeting
                for _ in range(rng.randrange(1, 6)):
                    frames = _random_frames(rng, valid)
                    body = struct.pack("<H", len(frames)) + b"".join(struct.pack("<I", len(f)) for f in frames)
                    body += b"".join(frames)
                    payload += struct.pack("<I", len(body)) + body
            try:
                s.sendall(payload)
                data = s.recv(65536)
                if data:
                    answered += 1
                else:
                    closed += 1
            except TimeoutError:
                pass
            except OSError:  # reset by the node: a refusal, as documented
                closed += 1
        assert proc.poll() is None, "the node died"
    assert answered + closed > 0
    _intact(info)


def test_fuzz_metrics_and_raw_bytes_at_the_zeromq_port(fuzz_node):
    info, proc = fuzz_node
    rng = random.Random(SEED + 2)
    mhost, mport = info["metrics_endpoint"].removeprefix("http://").split("/")[0].rsplit(":", 1)
    zhost, zport = info["endpoint"].removeprefix("tcp://").rsplit(":", 1)
    deadline = time.monotonic() + DEADLINE_S
    for i in range(ROUNDS // 4):
        if time.monotonic() > deadline:
            break
        host, port = (mhost, mport) if i % 2 == 0 else (zhost, zport)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.settimeout(0.3)
            if i % 4 == 0:
                line = rng.choice([b"GET /", b"POST /metrics", b"\x16\x03\x01", b"GET /metrics HTTP/9.9", b""])
                payload = line + rng.randbytes(rng.randrange(0, 200)) + b"\r\n\r\n"
            else:
                payload = rng.randbytes(rng.randrange(1, 300))
            try:
                s.sendall(payload)
                s.recv(4096)
            except (TimeoutError, OSError):
                pass
        assert proc.poll() is None, "the node died"
    with urllib.request.urlopen(info["metrics_endpoint"], timeout=10) as r:
        assert r.status == 200 and b"fabric_up 1.0" in r.read()
    _intact(info)


@pytest.fixture
def tls_fuzz_node(tmp_path):
    """A node with authentication on: its stream port speaks TLS with client certificates."""
    from fabric.client import use_credentials
    from fabric.security import keys

    keys_dir = tmp_path / "keys"
    keys.init(keys_dir)
    keys.add_client(keys_dir, "ops")
    config = tmp_path / "node.toml"
    config.write_text(f'[security]\nkeys_dir = "{keys_dir}"\nadmins = ["ops"]\n')
    node = JsonNode(
        tmp_path / "data",
        "--config",
        str(config),
        "--stream-listen",
        "fabric://127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    )
    use_credentials(str(keys_dir / "issued" / "ops.key_secret"), str(keys_dir / "server.key"))
    try:
        with Producer(node.info["stream_endpoint"]) as p:
            for i in range(100):
                p.send("kept", b"keep-%d" % i, key=b"k%d" % i)
            p.flush(10)
        yield node.info, node.proc
    finally:
        use_credentials(None, None)
        code = node.stop()
    assert "internal error handling a request" not in node.stderr, node.stderr[-3000:]
    assert "Traceback" not in node.stderr, node.stderr[-3000:]
    assert code == 0, node.stderr[-3000:]


def _client_hello() -> bytes:
    """The first flight of a real TLS client (a ClientHello), made in memory."""
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_fuzz_tls_stream_port(tls_fuzz_node):
    """Handshake garbage, mutated ClientHellos, random bytes and plain mutated requests at the TLS
    port; one connection that says nothing is closed after the handshake timeout. The node keeps
    serving an authorized TLS client and loses nothing."""
    info, proc = tls_fuzz_node
    host, port = info["stream_endpoint"].removeprefix("fabric://").rsplit(":", 1)
    rng = random.Random(SEED + 3)
    valid = _valid_requests(rng)
    hello = _client_hello()
    silent = socket.create_connection((host, int(port)), timeout=5)
    opened = time.monotonic()
    deadline = opened + DEADLINE_S
    for _ in range(ROUNDS // 5):
        if time.monotonic() > deadline:
            break
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.settimeout(0.3)
            choice = rng.randrange(4)
            if choice == 0:  # a TLS record header around garbage
                body = rng.randbytes(rng.randrange(0, 300))
                payload = b"\x16\x03" + bytes([rng.randrange(5)]) + struct.pack(">H", rng.randrange(1 << 16)) + body
            elif choice == 1:  # a real ClientHello, mutated
                h = bytearray(hello)
                for _ in range(rng.randrange(1, 6)):
                    h[rng.randrange(len(h))] ^= 1 << rng.randrange(8)
                payload = bytes(h[: rng.randrange(1, len(h) + 1)]) + rng.randbytes(rng.randrange(0, 40))
            elif choice == 2:  # random bytes
                payload = rng.randbytes(rng.randrange(1, 200))
            else:  # no TLS: a plain greeting and mutated requests (each refused, or the link closed)
                payload = b"FABRIC\x01\x00"
                for _ in range(rng.randrange(1, 4)):
                    frames = _random_frames(rng, valid)
                    body = struct.pack("<H", len(frames)) + b"".join(struct.pack("<I", len(f)) for f in frames)
                    payload += struct.pack("<I", len(body) + len(b"".join(frames))) + body + b"".join(frames)
            try:
                s.sendall(payload)
                s.recv(65536)
            except (TimeoutError, OSError):
                pass
        assert proc.poll() is None, "the node died"
    silent.settimeout(max(0.5, opened + 8 - time.monotonic()))
    try:
        assert silent.recv(1) == b"", "a connection that never did a handshake is closed"
    except ConnectionResetError:
        pass
    finally:
        silent.close()
    with urllib.request.urlopen(info["metrics_endpoint"], timeout=10) as r:
        metrics = r.read().decode()
    assert 'fabric_auth_refused_total{principal="(tls handshake)"}' in metrics
    with Admin(info["stream_endpoint"], timeout_ms=5000) as admin:  # the authorized TLS client (ops)
        assert admin.ping()["node"]
    _intact({**info, "endpoint": info["stream_endpoint"]})
