"""Admission: the checks every request passes before a handler sees it, and the error reply.

Theory of operation
-------------------
A storage node and a router are both front doors: each takes requests off a ZeroMQ ROUTER
socket (or a node's stream listener) and must tell a request it can serve from anything else
before doing work. The rule is written once, here, for both:

1. at least two frames (header, params), else PROTOCOL_ERROR;
2. the header decodes (:func:`~fabric.protocol.frames.decode_header`: magic, version, known
   flag bits), else PROTOCOL_ERROR or UNSUPPORTED_VERSION;
3. the op is known, else UNKNOWN_COMMAND;
4. the flags are a request's at this door, else PROTOCOL_ERROR (a reply or an event is never a
   request; a router also refuses FLAG_FORWARDED, which only nodes set between themselves);
5. the op is one this door takes, else PROTOCOL_ERROR (PUSH and ASSIGNMENT are events; a
   router also refuses REPLICA_FETCH, which only a node sends a node);
6. the params decode and pass the op's table (:func:`~fabric.protocol.ops.validate`), else
   PROTOCOL_ERROR or BAD_PARAMETER naming the param.

A :class:`Door` says what differs between a node and a router: the flags and ops it refuses
and which ops' validated params it remembers by their bytes (a producer sends the very same
params for every batch to a partition, a fetcher for every poll: one dict lookup instead of a
JSON parse and a schema check). Remembered params are shared between requests, so the ops a
door remembers are ops whose handlers only read their params.

Steps 1-2 are :func:`admit` alone; a node decodes the header itself (it counts requests by op
and needs the flags to know whether a refused request wants a reply) and calls
:func:`admit_header` for steps 3-6. Both are plain functions over their arguments (no state
but the cache the caller owns): the request path pays one call for them.

Any refusal is answered by :func:`error_reply`: the op and request id of the request (read
best-effort when the header did not decode), ``FLAG_REPLY``, the error's code as status, and
``{**details, "error": NAME, "message": text}`` as params; no reply at all when the request
asked for none (``FLAG_NO_REPLY``). Pure code: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fabric.errors import FabricError, ProtocolError, UnknownCommand
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op, commit_params, validate

OPS: dict[int, Op] = {int(op): op for op in Op}
EVENT_OPS = frozenset({Op.PUSH, Op.ASSIGNMENT})  # server -> client only

Params = dict[str, Any]
ParamsCache = dict[tuple[Op, bytes], Params]


@dataclass(frozen=True, slots=True)
class Door:
    """What a front door refuses and remembers (see the module's theory of operation)."""

    name: str  # "node" or "router": named in the refusals
    refused_flags: int
    refused_ops: frozenset[Op]
    cached_ops: frozenset[Op]  # validated params remembered by their bytes
    cache_max: int  # entries; the cache is emptied when full


# A storage node takes requests from clients, routers (unwrapped: fabric/node/server.py) and
# other nodes (FLAG_FORWARDED, REPLICA_FETCH); its handlers only read PRODUCE's and FETCH's params.
NODE = Door(
    "node",
    refused_flags=fr.FLAG_REPLY | fr.FLAG_EVENT,
    refused_ops=EVENT_OPS,
    cached_ops=frozenset({Op.PRODUCE, Op.FETCH}),
    cache_max=4096,
)
# A router takes requests from clients only, and only reads their params (to route them).
ROUTER = Door(
    "router",
    refused_flags=0xFF & ~fr.FLAG_NO_REPLY,
    refused_ops=EVENT_OPS | {Op.REPLICA_FETCH},
    cached_ops=frozenset(Op),
    cache_max=10_000,
)


def admit(frames: Sequence[Any], door: Door, cache: ParamsCache) -> tuple[fr.Header, Op, Params]:
    """A request's header, op and validated params, or the FabricError to refuse it with."""
    if len(frames) < 2:
        raise ProtocolError(f"a message has at least 2 frames (header, params), got {len(frames)}")
    header = fr.decode_header(frames[0])
    op, params = admit_header(header, frames[1], door, cache)
    return header, op, params


def admit_header(header: fr.Header, raw: Any, door: Door, cache: ParamsCache) -> tuple[Op, Params]:
    """The op and validated params of a request whose header decoded (steps 3-6)."""
    op = OPS.get(header.op)
    if op is None:
        raise UnknownCommand(f"unknown op {header.op}")
    if header.flags & door.refused_flags:
        raise ProtocolError(f"{op.name} with flags 0x{header.flags:02x} is not a request to a {door.name}")
    if op in door.refused_ops:
        raise ProtocolError(f"{op.name} is not a request to a {door.name}")
    if op in door.cached_ops:
        key = (op, raw if type(raw) is bytes else bytes(raw))
        params = cache.get(key)
        if params is None:
            params = validate(op, fr.decode_params(raw))
            if len(cache) >= door.cache_max:
                cache.clear()
            cache[key] = params
        return op, params
    if op is Op.COMMIT:
        fast = commit_params(raw)  # a consumer's COMMIT of one partition, without a JSON parse
        if fast is not None:
            return op, fast
    return op, validate(op, fr.decode_params(raw))


def error_reply(header: fr.Header | None, frames: Sequence[Any], exc: FabricError) -> list[fr.Frame] | None:
    """The reply refusing a request with ``exc``; None when the request asked for no reply.
    ``header`` None: the request's header did not decode (its op and id are read from
    ``frames`` as far as they can be)."""
    if header is None:
        op, request_id = fr.peek_request_id(frames)
        header = fr.Header(op, request_id)
    if header.flags & fr.FLAG_NO_REPLY:
        return None
    reply = fr.Header(header.op, header.request_id, fr.FLAG_REPLY, exc.code)
    return fr.encode(reply, {**exc.details, "error": exc.name, "message": exc.message})
