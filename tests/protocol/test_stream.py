"""The stream transport's envelope: round trip, pieces vs whole, and clear errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.errors import ProtocolError
from fabric.protocol import stream as sf
from fabric.protocol.stream import GREETING, StreamDecoder, encode, parse_endpoint

messages = st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=6), max_size=8)


@given(messages)
def test_round_trip(msgs: list[list[bytes]]) -> None:
    d = StreamDecoder(1 << 20)
    assert d.feed(GREETING + b"".join(encode(m) for m in msgs)) == msgs
    assert d.buffered == 0


@given(messages, st.lists(st.integers(1, 50), min_size=1, max_size=40))
def test_pieces_and_whole_agree(msgs: list[list[bytes]], cuts: list[int]) -> None:
    wire = GREETING + b"".join(encode(m) for m in msgs)
    d = StreamDecoder(1 << 20)
    got: list[list[bytes]] = []
    pos, i = 0, 0
    while pos < len(wire):
        step = cuts[i % len(cuts)]
        got += d.feed(wire[pos : pos + step])
        pos, i = pos + step, i + 1
    assert got == msgs


@given(st.binary(max_size=400))
def test_any_bytes_decode_or_raise_a_protocol_error(junk: bytes) -> None:
    d = StreamDecoder(1 << 16)
    try:
        for frames in d.feed(GREETING + junk):
            assert frames and all(isinstance(f, bytes) for f in frames)
    except ProtocolError:
        pass


@given(st.binary(min_size=8, max_size=40).filter(lambda b: b[:6] != GREETING[:6]))
def test_a_peer_that_does_not_greet_is_refused(junk: bytes) -> None:
    with pytest.raises(ProtocolError, match="does not speak"):
        StreamDecoder(1 << 16).feed(junk)


def test_a_zeromq_peer_is_refused_at_its_first_byte() -> None:
    with pytest.raises(ProtocolError, match="does not speak"):
        StreamDecoder(1 << 16).feed(b"\xff")  # ZMTP's greeting starts with 0xff


def test_other_version_is_named() -> None:
    with pytest.raises(ProtocolError, match="version 2"):
        StreamDecoder(1 << 16).feed(b"FABRIC\x02\x00")


def test_oversize_message_is_refused_before_it_is_buffered() -> None:
    d = StreamDecoder(1000)
    with pytest.raises(ProtocolError, match="exceeds the limit of 1000"):
        d.feed(GREETING + encode([b"x" * 2000])[:10])


@pytest.mark.parametrize(
    "wire",
    [
        b"\x06\x00\x00\x00\x00\x00" + b"\x00" * 4,  # zero frames
        b"\x05\x00\x00\x00\x02\x00" + b"\x00" * 8,  # body too short for its frame lengths
        b"\x0a\x00\x00\x00\x01\x00\x09\x00\x00\x00" + b"ab",  # lengths do not add up
    ],
)
def test_broken_envelopes_are_named(wire: bytes) -> None:
    with pytest.raises(ProtocolError, match="bad stream envelope"):
        StreamDecoder(1 << 16).feed(GREETING + wire + b"\x00" * 16)


def test_empty_frames_survive() -> None:
    assert StreamDecoder(100).feed(GREETING + encode([b"h", b"", b"d"])) == [[b"h", b"", b"d"]]


def test_envelope_limits() -> None:
    with pytest.raises(ProtocolError):
        sf.envelope([])
    with pytest.raises(ProtocolError):
        sf.envelope([b""] * (sf.FRAMES_MAX + 1))


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("fabric://127.0.0.1:7421", ("127.0.0.1", 7421)),
        ("fabric://localhost:*", ("localhost", 0)),
        ("fabric://[::1]:0", ("::1", 0)),
    ],
)
def test_parse_endpoint(endpoint: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(endpoint) == expected


@pytest.mark.parametrize(
    "bad", ["tcp://127.0.0.1:1", "fabric://127.0.0.1", "fabric://:1", "fabric://h:99999", "fabric://h:x"]
)
def test_bad_endpoints_are_named(bad: str) -> None:
    with pytest.raises(ProtocolError, match="endpoint"):
        parse_endpoint(bad)


@given(st.lists(st.binary(min_size=1, max_size=20), max_size=10), st.integers(0, 250))
def test_advance_drops_exactly_the_written_bytes(bufs: list[bytes], sent: int) -> None:
    from collections import deque

    sent = min(sent, sum(map(len, bufs)))
    out: deque = deque(bytearray(b) for b in bufs)
    sf.advance(out, sent)
    assert b"".join(bytes(x) for x in out) == b"".join(bufs)[sent:]


def test_the_same_host_name_of_an_endpoint() -> None:
    """Loopback endpoints (and the wildcard a node may listen on) have an abstract Unix socket
    name; others have none, and neither does a port not yet chosen."""
    name = sf.local_address
    assert name("127.0.0.1", 7421) == "\0fabric-stream/127.0.0.1:7421"
    assert name("localhost", 7421) == name("0.0.0.0", 7421) == name("127.0.0.1", 7421)
    assert name("127.0.0.2", 7421) == "\0fabric-stream/127.0.0.2:7421"
    assert name("[::1]", 7421) == name("::", 7421) == "\0fabric-stream/::1:7421"
    assert name("10.1.2.3", 7421) is None
    assert name("node-a.example", 7421) is None
    assert name("127.0.0.1", 0) is None
