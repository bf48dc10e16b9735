"""ops.validate: required params, exact types, ranges, names, defaults."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.errors import BadParameter, FabricError
from fabric.protocol import ops as O
from fabric.protocol.ops import SCHEMAS, Op, Param

from .helpers import MEDIUM, THOROUGH, is_known_bug, json_values

# One valid value for every required param.
REQUIRED_SAMPLE: dict[str, Any] = {
    "queue": "orders",
    "name": "orders",
    "partition": 0,
    "offset": 0,
    "group": "billing",
    "subscription": 1,
    "offsets": {"0": 10},
    "ranges": {"0": [[0, 5]]},
    "partitions": [0],
    "visibility_ms": 1000,
    "replica": "store-2",
    "leader_epoch": 3,
    "fetch_offset": 100,
    "last_fetched_epoch": 2,
    "principal": "alice",
    "target": "queue:orders",
    "operation": "produce",
    "resource": "orders.*",
}


# where one param name means different things in different ops
OP_SAMPLES: dict[Op, dict[str, Any]] = {Op.ALTER_QUEUE: {"partitions": 4}, Op.SETTLE: {"member": 7, "action": "ack"}}


def minimal(op: Op) -> dict[str, Any]:
    sample = {**REQUIRED_SAMPLE, **OP_SAMPLES.get(op, {})}
    return {name: sample[name] for name, spec in SCHEMAS[op].items() if spec.required}


PARAMS = [(op, name, spec) for op, schema in SCHEMAS.items() for name, spec in schema.items()]
REQUIRED = [(op, name) for op, name, spec in PARAMS if spec.required]


def kinds(spec: Param) -> tuple[type, ...]:
    return spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)


INT_PARAMS = [(op, name, spec) for op, name, spec in PARAMS if int in kinds(spec)]
BOUNDED = [(op, name, spec) for op, name, spec in INT_PARAMS if spec.low is not None]


def ids(cases: list[tuple[Any, ...]]) -> list[str]:
    return [f"{c[0].name}.{c[1]}" for c in cases]


def test_every_request_op_has_a_schema() -> None:
    assert set(SCHEMAS) == set(Op) - {Op.PUSH, Op.ASSIGNMENT}  # events: server -> client only
    assert {int(op) for op in Op} == O.KNOWN_OPS


@pytest.mark.parametrize("op", list(SCHEMAS), ids=lambda op: op.name)
def test_minimal_params_validate_and_defaults_are_filled(op: Op) -> None:
    out = O.validate(op, minimal(op))
    assert set(out) == set(SCHEMAS[op])
    for name, spec in SCHEMAS[op].items():
        assert out[name] == (minimal(op)[name] if spec.required else spec.default)


def test_defaults() -> None:
    assert O.validate(Op.PRODUCE, {"queue": "q", "partition": 3})["acks"] == "leader"
    fetch = O.validate(Op.FETCH, {"queue": "q", "partition": 0, "offset": 5})
    assert (fetch["max_bytes"], fetch["wait_ms"]) == (1024 * 1024, 0)
    sub = O.validate(Op.SUBSCRIBE, {"queue": "q"})
    assert {k: sub[k] for k in ("group", "partitions", "start", "credit_messages", "credit_bytes")} == {
        "group": None,
        "partitions": None,
        "start": "committed",
        "credit_messages": 10_000,
        "credit_bytes": 16 * 1024 * 1024,
    }
    assert O.validate(Op.CREDIT, {"subscription": 4}) == {"subscription": 4, "messages": 0, "bytes": 0}
    assert O.validate(Op.LIST_OFFSETS, {"queue": "q", "partition": 1})["at"] == "latest"
    assert O.validate(Op.CREATE_QUEUE, {"name": "q"}) == {
        "name": "q",
        "settings": {},
        "if_not_exists": False,
        "forwarded": False,
        "leader_hint": None,
    }
    assert O.validate(Op.DELETE_QUEUE, {"name": "q"})["if_exists"] is False
    assert O.validate(Op.PING, {}) == {"node": None} and O.validate(Op.HEARTBEAT, {}) == {}
    assert O.validate(Op.CLUSTER_STATUS, {}) == {}


@pytest.mark.parametrize(("op", "name"), REQUIRED, ids=ids(REQUIRED))
def test_missing_required_param_is_named(op: Op, name: str) -> None:
    params = minimal(op)
    del params[name]
    with pytest.raises(BadParameter, match=f"needs param '{name}'"):
        O.validate(op, params)


@pytest.mark.parametrize("op", list(SCHEMAS), ids=lambda op: op.name)
def test_unknown_param_is_named(op: Op) -> None:
    with pytest.raises(BadParameter, match="'partiton'"):
        O.validate(op, {**minimal(op), "partiton": 1})


@pytest.mark.parametrize(("op", "name", "spec"), INT_PARAMS, ids=ids(INT_PARAMS))
@pytest.mark.parametrize("bad", [True, False, "3", 3.0, [3], {"v": 3}])
def test_int_params_reject_other_types(op: Op, name: str, spec: Param, bad: Any) -> None:
    with pytest.raises(BadParameter, match=f"param '{name}' must be"):
        O.validate(op, {**minimal(op), name: bad})


@pytest.mark.parametrize(("op", "name", "spec"), BOUNDED, ids=ids(BOUNDED))
def test_ranges_are_inclusive_and_enforced(op: Op, name: str, spec: Param) -> None:
    assert spec.low is not None and spec.high is not None
    for good in (spec.low, spec.high):
        assert O.validate(op, {**minimal(op), name: good})[name] == good
    for bad in (spec.low - 1, spec.high + 1):
        with pytest.raises(BadParameter, match=f"param '{name}' must be in {spec.low}..{spec.high}"):
            O.validate(op, {**minimal(op), name: bad})


STR_PARAMS = [(op, name, spec) for op, name, spec in PARAMS if kinds(spec) == (str,)]


@pytest.mark.parametrize(("op", "name", "spec"), STR_PARAMS, ids=ids(STR_PARAMS))
@pytest.mark.parametrize("bad", [3, True, None, ["q"]])
def test_str_params_reject_other_types(op: Op, name: str, spec: Param, bad: Any) -> None:
    with pytest.raises(BadParameter, match=f"'{name}'"):
        O.validate(op, {**minimal(op), name: bad})


BOOL_PARAMS = [(op, name) for op, name, spec in PARAMS if kinds(spec) == (bool,)]


@pytest.mark.parametrize(("op", "name"), BOOL_PARAMS, ids=ids(BOOL_PARAMS))
def test_bool_params_reject_ints(op: Op, name: str) -> None:
    assert O.validate(op, {**minimal(op), name: True})[name] is True
    with pytest.raises(BadParameter, match=f"'{name}' must be bool"):
        O.validate(op, {**minimal(op), name: 1})


BAD_NAMES = [
    "",
    "-orders",
    ".orders",
    "_x",
    "__",
    "___x",
    "a b",
    "a/b",
    "a\\b",
    "..",
    "é",
    "q\x00",
    "x" * 201,
    "a\nb",
    "q:1",
]
GOOD_NAMES = ["a", "0", "x" * 200, "Orders.v2_eu-west-1", "a-", "a..b", "__usage"]  # '__': the node's own


@pytest.mark.parametrize("bad", BAD_NAMES)
@pytest.mark.parametrize(
    ("op", "name"),
    [(Op.PRODUCE, "queue"), (Op.CREATE_QUEUE, "name"), (Op.COMMIT, "queue"), (Op.DESCRIBE_QUEUE, "name")],
)
def test_bad_queue_names(op: Op, name: str, bad: str) -> None:
    with pytest.raises(BadParameter, match=f"'{name}'"):
        O.validate(op, {**minimal(op), name: bad})


@pytest.mark.parametrize("good", GOOD_NAMES)
def test_good_queue_names(good: str) -> None:
    assert O.validate(Op.CREATE_QUEUE, {"name": good})["name"] == good


def test_group_names_also_allow_colons_and_are_optional_only_for_subscribe() -> None:
    assert O.validate(Op.SUBSCRIBE, {"queue": "q", "group": "team:billing"})["group"] == "team:billing"
    assert O.validate(Op.SUBSCRIBE, {"queue": "q", "group": None})["group"] is None
    with pytest.raises(BadParameter, match="'group'"):
        O.validate(Op.SUBSCRIBE, {"queue": "q", "group": ":x"})
    with pytest.raises(BadParameter, match="'group' must be str"):
        O.validate(Op.COMMIT, {"queue": "q", "group": None, "offsets": {}})


@pytest.mark.parametrize(("op", "name"), [(Op.PRODUCE, "acks"), (Op.SUBSCRIBE, "start"), (Op.LIST_OFFSETS, "at")])
def test_choices(op: Op, name: str) -> None:
    spec = SCHEMAS[op][name]
    assert spec.choices is not None
    for choice in spec.choices:
        assert O.validate(op, {**minimal(op), name: choice})[name] == choice
    for bad in ("LATEST", "", "soon"):
        with pytest.raises(BadParameter, match=f"'{name}' must be one of"):
            O.validate(op, {**minimal(op), name: bad})


@pytest.mark.parametrize(("op", "name"), [(Op.SUBSCRIBE, "start"), (Op.LIST_OFFSETS, "at")])
def test_start_and_at_also_take_an_offset(op: Op, name: str) -> None:
    assert O.validate(op, {**minimal(op), name: 0})[name] == 0
    assert O.validate(op, {**minimal(op), name: O.I64_MAX})[name] == O.I64_MAX
    for bad in (-1, O.I64_MAX + 1, True, 1.5, None):
        with pytest.raises(BadParameter, match=f"'{name}'"):
            O.validate(op, {**minimal(op), name: bad})


@pytest.mark.parametrize("good", [None, [0], [0, 1, 65535]])
def test_partition_lists(good: list[int] | None) -> None:
    assert O.validate(Op.SUBSCRIBE, {"queue": "q", "partitions": good})["partitions"] == good


@pytest.mark.parametrize("bad", [[], [1, 1], [-1], [65536], [True], ["1"], [1.0], [[1]], [{}], 3, "0,1"])
def test_bad_partition_lists(bad: Any) -> None:
    with pytest.raises(BadParameter, match="'partitions'"):
        O.validate(Op.SUBSCRIBE, {"queue": "q", "partitions": bad})


@pytest.mark.parametrize("good", [{}, {"0": 0}, {"3": O.I64_MAX, "65535": 1}])
def test_offset_maps(good: dict[str, int]) -> None:
    assert O.validate(Op.COMMIT, {"queue": "q", "group": "g", "offsets": good})["offsets"] == good


@pytest.mark.parametrize(
    "bad",
    [{"x": 1}, {"": 1}, {"-1": 1}, {"65536": 1}, {"0": -1}, {"0": O.I64_MAX + 1}, {"0": True}, {"0": 1.0}, {"0": None}],
)
def test_bad_offset_maps(bad: dict[str, Any]) -> None:
    with pytest.raises(BadParameter, match="'offsets'"):
        O.validate(Op.COMMIT, {"queue": "q", "group": "g", "offsets": bad})


def test_offsets_unicode_digit() -> None:
    with pytest.raises(BadParameter, match="'offsets'"):
        O.validate(Op.COMMIT, {"queue": "q", "group": "g", "offsets": {"²": 1}})


@pytest.mark.parametrize("offsets", [{"07": 1, "7": 2}, {"\u0663": 1}])
def test_offsets_keys_must_be_canonical(offsets: dict[str, int]) -> None:
    with pytest.raises(BadParameter, match="'offsets'"):
        O.validate(Op.COMMIT, {"queue": "q", "group": "g", "offsets": offsets})


@pytest.mark.parametrize(("op", "name"), [(Op.CREATE_QUEUE, "name"), (Op.COMMIT, "group")])
def test_trailing_newline_in_names_is_rejected(op: Op, name: str) -> None:
    with pytest.raises(BadParameter):
        O.validate(op, {**minimal(op), name: "orders\n"})


def test_validate_push_from_a_client_is_a_fabric_error() -> None:
    with pytest.raises(FabricError):
        O.validate(Op.PUSH, {})


def test_defaults_are_not_shared_between_calls() -> None:
    O.validate(Op.CREATE_QUEUE, {"name": "a"})["settings"]["partitions"] = 8
    try:
        assert O.validate(Op.CREATE_QUEUE, {"name": "b"})["settings"] == {}
    finally:
        SCHEMAS[Op.CREATE_QUEUE]["settings"].default.clear()  # undo the damage for the other tests


@st.composite
def fuzzed_params(draw: st.DrawFn) -> tuple[Op, dict[str, Any]]:
    """Params mixing the op's real names (with good and random values) and random names."""
    op = draw(st.sampled_from(list(SCHEMAS)))
    params: dict[str, Any] = {}
    for name in SCHEMAS[op]:
        choice = draw(st.integers(0, 3))
        if choice == 1 and name in REQUIRED_SAMPLE:
            params[name] = REQUIRED_SAMPLE[name]
        elif choice >= 2:
            params[name] = draw(json_values)
    if draw(st.integers(0, 4)) == 0:
        params[draw(st.text(max_size=8))] = draw(json_values)
    return op, params


@THOROUGH
@given(fuzzed_params())
def test_validate_returns_a_full_dict_or_raises_bad_parameter(sample: tuple[Op, dict[str, Any]]) -> None:
    op, params = sample
    try:
        out = O.validate(op, params)
    except BadParameter as exc:
        assert exc.code == BadParameter.code
        assert f"{op.name}" in str(exc)
        return
    except Exception as exc:
        if is_known_bug(exc):
            return
        raise
    assert isinstance(out, dict)
    assert set(out) == set(SCHEMAS[op])
    assert all(out[k] == v for k, v in params.items())


@MEDIUM
@given(st.sampled_from(list(SCHEMAS)), st.dictionaries(st.text(max_size=10), json_values, max_size=5))
def test_validate_random_json_objects(op: Op, params: dict[str, Any]) -> None:
    try:
        out = O.validate(op, params)
    except FabricError:
        return
    except Exception as exc:
        if not is_known_bug(exc):
            raise
    else:
        assert isinstance(out, dict)


# ---------------------------------------------------------------- COMMIT's fast path


def _general_commit(raw: bytes) -> dict[str, Any] | FabricError:
    from fabric.protocol.frames import decode_params

    try:
        return O.validate(Op.COMMIT, decode_params(raw))
    except FabricError as exc:
        return exc


@pytest.mark.parametrize(
    "params",
    [
        {"queue": "orders", "group": "billing", "offsets": {"0": 10}},
        {"queue": "a.b-c_1", "group": "g:1.x-y", "offsets": {"65535": 0}},
        {"queue": "orders", "group": "billing", "offsets": {"3": O.I64_MAX}, "subscription": 7},
        {"queue": "orders", "group": "billing", "offsets": {"3": 1}, "subscription": None},
        {"queue": "q" * 200, "group": "g" * 200, "offsets": {"0": 1}},
    ],
)
def test_commit_fast_path_reads_what_validate_reads(params: dict[str, Any]) -> None:
    from fabric.protocol.frames import encode_params

    raw = encode_params(params)  # the clients' form
    assert O.commit_params(raw) == _general_commit(raw)
    assert O.commit_params(memoryview(raw)) == _general_commit(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"queue":"orders","group":"billing","offsets":{"65536":1}}',  # partition out of range
        b'{"queue":"orders","group":"billing","offsets":{"0":9223372036854775808}}',  # offset past i64
        b'{"queue":"orders","group":"billing","offsets":{"0":1},"subscription":9223372036854775808}',
        b'{"queue":"__internal","group":"billing","offsets":{"0":1}}',  # internal queues: general path
        b'{"queue":"orders","group":"billing","offsets":{"0":1,"1":2}}',  # two partitions
        b'{"queue": "orders","group":"billing","offsets":{"0":1}}',  # another encoder's spacing
        b'{"queue":"orders","group":"billing","offsets":{"00":1}}',  # a leading zero
        b'{"queue":"orders","group":"billing","offsets":{"0":-1}}',
        b'{"queue":"' + b"q" * 201 + b'","group":"billing","offsets":{"0":1}}',  # name too long
        b'{"queue":"orders","group":"billing","offsets":{"0":1},"forget":true}',
    ],
)
def test_commit_fast_path_leaves_everything_else_to_validate(raw: bytes) -> None:
    assert O.commit_params(raw) is None
