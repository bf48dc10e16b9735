"""docs/protocol.md stays true: the worked example, the error table, the op and settings tables."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from fabric.errors import all_codes
from fabric.protocol import batch as B
from fabric.protocol.ops import SCHEMAS, Op
from fabric.settings import QueueSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"

pytestmark = pytest.mark.skipif(not DOC.exists(), reason="docs/protocol.md not present")


def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def section(title: str) -> str:
    text = doc()
    start = text.index(f"\n### {title}")
    end = text.find("\n### ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_worked_example_matches_the_encoder() -> None:
    block = re.search(r"<!-- batch-example:begin -->\n```\n(.*?)```\n<!-- batch-example:end -->", doc(), re.S)
    assert block, "worked example markers missing"
    dumped = bytes.fromhex("".join(line[6:] for line in block.group(1).splitlines()))
    raw = B.encode_batch([b"hello", b"fabric"], keys=[b"k1", None], timestamps=[1_700_000_000_000, 1_700_000_000_250])
    assert dumped == raw
    buf = bytearray(raw)
    B.stamp(buf, 42, 3)
    assert buf[:21].hex(" ") == "2a 00 00 00 00 00 00 00 52 00 00 00 03 00 00 00 01 48 a6 fc cb"
    assert f"0x{B.parse_header(raw).crc:08x}" in doc()


def test_every_error_code_is_in_the_table() -> None:
    text = doc()
    for code, name in all_codes().items():
        assert re.search(rf"^\| {code} \| `{name}` \|", text, re.M), f"{code} {name} missing from docs/protocol.md"


@pytest.mark.parametrize("op", list(Op), ids=lambda op: op.name)
def test_every_op_and_param_is_documented(op: Op) -> None:
    body = section(f"{op.name} ({int(op)})")
    for name in SCHEMAS.get(op, {}):
        assert f"| `{name}` |" in body, f"{op.name} param {name} missing from docs/protocol.md"


def test_every_queue_setting_is_documented_with_its_default() -> None:
    text = doc()
    for f in dataclasses.fields(QueueSettings):
        if isinstance(f.default, bool):
            default = f"`{str(f.default).lower()}`"  # JSON's spelling
        else:
            default = f'`"{f.default}"`' if isinstance(f.default, str) else str(f.default)
        assert re.search(rf"^\| `{f.name}` \| \w+ \| {re.escape(default)}(?!\d)", text, re.M), f.name
