"""The typed params of each request (fabric.protocol.requests) say what validate returns."""

from __future__ import annotations

import pytest

from fabric.protocol.ops import SCHEMAS, Op, validate
from fabric.protocol.requests import REQUEST_TYPES


def test_every_request_has_a_type() -> None:
    assert set(REQUEST_TYPES) == set(SCHEMAS)


@pytest.mark.parametrize("op", sorted(SCHEMAS))
def test_a_type_names_every_param_of_its_op_and_each_is_always_there(op: Op) -> None:
    typed = REQUEST_TYPES[op]
    assert set(typed.__annotations__) == set(SCHEMAS[op])
    assert typed.__required_keys__ == frozenset(SCHEMAS[op])  # type: ignore[attr-defined]


def test_validate_fills_in_every_key_the_type_names() -> None:
    params = validate(Op.FETCH, {"queue": "q", "partition": 0, "offset": 0})
    assert set(params) == set(REQUEST_TYPES[Op.FETCH].__annotations__)
