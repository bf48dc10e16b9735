"""The one admission rule of a node and a router, and the error reply any refusal gets."""

from __future__ import annotations

import pytest

from fabric.errors import BadParameter, FabricError, NotLeader, ProtocolError, UnknownCommand, UnsupportedVersion
from fabric.protocol import frames as fr
from fabric.protocol.admission import NODE, ROUTER, Door, ParamsCache, admit, error_reply
from fabric.protocol.ops import Op


def header(op: int, *, flags: int = 0, version: int = 1, rid: int = 7) -> bytes:
    return fr.HEADER.pack(b"FB", version, op, flags, 0, 0, rid)


PRODUCE = b'{"queue":"q","partition":0}'


@pytest.mark.parametrize("door", [NODE, ROUTER])
def test_a_request_is_admitted_with_its_defaults(door: Door) -> None:
    cache: ParamsCache = {}
    h, op, params = admit([header(Op.PRODUCE), PRODUCE, b"batch"], door, cache)
    assert (h.request_id, op) == (7, Op.PRODUCE)
    assert params["queue"] == "q" and params["acks"] == "leader"


@pytest.mark.parametrize("door", [NODE, ROUTER])
@pytest.mark.parametrize(
    ("frames", "error"),
    [
        ([b"\x01\x02"], ProtocolError),
        ([b"short", b""], ProtocolError),
        ([b"XX" + b"\0" * 14, b""], ProtocolError),
        ([header(Op.PING, version=9), b""], UnsupportedVersion),
        ([header(99), b""], UnknownCommand),
        ([header(99, flags=fr.FLAG_REPLY), b""], UnknownCommand),  # the op first, then the flags
        ([header(Op.PING, flags=0x80), b""], ProtocolError),
        ([header(Op.PING, flags=fr.FLAG_REPLY), b""], ProtocolError),
        ([header(Op.PING, flags=fr.FLAG_EVENT), b""], ProtocolError),
        ([header(Op.PUSH), b""], ProtocolError),
        ([header(Op.ASSIGNMENT), b""], ProtocolError),
        ([header(Op.PING), b"{not json"], ProtocolError),
        ([header(Op.PING), b"[1,2]"], ProtocolError),
        ([header(Op.PRODUCE), b'{"queue":"q"}'], BadParameter),
    ],
)
def test_both_doors_refuse_what_is_not_a_request(door: Door, frames: list[bytes], error: type[FabricError]) -> None:
    with pytest.raises(error):
        admit(frames, door, {})


def test_a_router_also_refuses_what_only_nodes_send_each_other() -> None:
    forwarded = [header(Op.PING, flags=fr.FLAG_FORWARDED), b""]
    assert admit(forwarded, NODE, {})[1] is Op.PING
    with pytest.raises(ProtocolError, match="router"):
        admit(forwarded, ROUTER, {})
    fetch = b'{"queue":"q","partition":0,"replica":"n2","leader_epoch":1,"fetch_offset":0,"last_fetched_epoch":0}'
    assert admit([header(Op.REPLICA_FETCH), fetch], NODE, {})[1] is Op.REPLICA_FETCH
    with pytest.raises(ProtocolError, match="REPLICA_FETCH"):
        admit([header(Op.REPLICA_FETCH), fetch], ROUTER, {})


def test_params_are_remembered_by_their_bytes_for_the_doors_ops_only() -> None:
    node: ParamsCache = {}
    first = admit([header(Op.PRODUCE), PRODUCE], NODE, node)[2]
    assert admit([header(Op.PRODUCE), PRODUCE], NODE, node)[2] is first
    ping = b'{"node":"n1"}'
    admit([header(Op.PING), ping], NODE, node)
    assert list(node) == [(Op.PRODUCE, PRODUCE)]  # a node's handlers may keep other params
    router: ParamsCache = {}
    admit([header(Op.PING), ping], ROUTER, router)
    assert (Op.PING, ping) in router


def test_a_full_cache_is_emptied() -> None:
    door = Door("node", NODE.refused_flags, NODE.refused_ops, NODE.cached_ops, cache_max=2)
    cache: ParamsCache = {}
    for p in range(3):
        admit([header(Op.PRODUCE), b'{"queue":"q","partition":%d}' % p], door, cache)
    assert len(cache) == 1


def test_a_commit_of_one_partition_is_read_without_a_json_parse() -> None:
    raw = b'{"queue":"q","group":"g","offsets":{"0":5}}'
    params = admit([header(Op.COMMIT), raw], NODE, {})[2]
    assert params == {"queue": "q", "group": "g", "offsets": {"0": 5}, "subscription": None, "forget": False}


def test_the_error_reply_names_the_error_and_keeps_the_request_id() -> None:
    h = fr.decode_header(header(Op.FETCH, rid=42))
    reply = error_reply(h, [], NotLeader("moved", leader="n2"))
    assert reply is not None
    msg = fr.decode(reply)
    assert (msg.header.op, msg.header.request_id, msg.header.status) == (Op.FETCH, 42, NotLeader.code)
    assert msg.header.flags == fr.FLAG_REPLY
    assert msg.params == {"leader": "n2", "error": "NOT_LEADER", "message": "moved"}


def test_an_undecodable_header_is_answered_with_what_can_be_read() -> None:
    frames = [header(Op.PING, version=9, rid=9), b""]
    msg = fr.decode(error_reply(None, frames, UnsupportedVersion("v9")) or [])
    assert (msg.header.op, msg.header.request_id) == (Op.PING, 9)
    msg = fr.decode(error_reply(None, [b"x"], ProtocolError("short")) or [])
    assert (msg.header.op, msg.header.request_id, msg.header.status) == (0, 0, ProtocolError.code)


def test_a_request_that_wants_no_reply_gets_none() -> None:
    h = fr.decode_header(header(Op.PRODUCE, flags=fr.FLAG_NO_REPLY))
    assert error_reply(h, [], BadParameter("no")) is None
