"""LIST_QUEUES is paged (from, limit, prefix; the reply's next names the next page's first), so any
number of queues can be listed: before, one reply held every queue and a node with ~14,000 of them
answered past the params frame's 1 MiB ceiling."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from fabric.client import Admin, Producer
from fabric.errors import BadParameter
from fabric.protocol import frames as fr
from fabric.protocol.ops import Op

pytestmark = pytest.mark.integration

NAMES = sorted([f"q{i:02d}" for i in range(17)] + ["orders.eu", "orders.us", "ordersx", "other"])


def _page(admin: Admin, **params: Any) -> dict[str, Any]:
    return admin._conn.request(Op.LIST_QUEUES, params).params


def test_pages_join_up_exactly_and_list_queues_reads_them_all(node) -> None:
    with Admin(node.endpoint) as admin:
        for name in NAMES:
            admin.create_queue(name)
        seen: list[str] = []
        start = None
        while True:
            reply = _page(admin, limit=4, **({"from": start} if start else {}))
            names = [q["name"] for q in reply["queues"]]
            assert len(names) == 4 or reply["next"] is None, reply
            if reply["next"] is not None:
                assert NAMES.index(reply["next"]) == NAMES.index(names[-1]) + 1  # the next page's first
            seen += names
            start = reply["next"]
            if start is None:
                break
        assert seen == NAMES  # no queue missing or repeated at a page boundary
        assert _page(admin, limit=len(NAMES))["next"] is None  # exactly one full page: the last
        assert [q["name"] for q in admin.list_queues()] == NAMES
        assert [q["name"] for q in admin.iter_queues(page=1)] == NAMES
        assert [q["name"] for q in admin.iter_queues(page=5000)] == NAMES
        # from: any name, held or not; past the end an empty last page
        assert [q["name"] for q in _page(admin, **{"from": "q15x", "limit": 3})["queues"]] == ["q16"]
        assert _page(admin, **{"from": "zzz"}) == {"queues": [], "next": None}


def test_a_prefix_lists_its_queues_only(node) -> None:
    with Admin(node.endpoint) as admin:
        for name in NAMES:
            admin.create_queue(name)
        assert [q["name"] for q in admin.list_queues(prefix="orders.")] == ["orders.eu", "orders.us"]
        assert [q["name"] for q in admin.iter_queues("orders", page=1)] == ["orders.eu", "orders.us", "ordersx"]
        reply = _page(admin, prefix="q1", limit=5)
        assert [q["name"] for q in reply["queues"]] == [f"q1{i}" for i in range(5)] and reply["next"] == "q15"
        reply = _page(admin, prefix="q1", **{"from": "q16"})
        assert [q["name"] for q in reply["queues"]] == ["q16"] and reply["next"] is None  # "q2..." is not q1's
        assert admin.list_queues(prefix="nothing") == []
        r = subprocess.run(
            [sys.executable, "-m", "fabric.cli", "queue", "list", "--prefix", "orders", "--json", "-e", node.endpoint],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        assert [q["name"] for q in json.loads(r.stdout)] == ["orders.eu", "orders.us", "ordersx"]


def test_an_entry_says_what_describe_queue_says(node) -> None:
    with Admin(node.endpoint) as admin:
        admin.create_queue("busy", partitions=3)
        admin.create_queue("tiers", partitions=2, priority_levels=3)
        with Producer(node.endpoint, acks="all") as p:
            for i in range(60):
                p.send("busy", b"m%d" % i, key=b"k%d" % i)
                p.send("tiers", b"t%d" % i, priority=i % 3)
            p.flush(30)
        listed = admin.list_queues()
        assert [q["name"] for q in listed] == ["busy", "tiers"]
        for q in listed:
            d = admin.describe_queue(q["name"])
            assert q == {k: d[k] for k in ("name", "partitions", "messages", "size_bytes")}
            assert q["messages"] == 60 and q["size_bytes"] > 0


def test_bad_params_are_refused_by_name(node) -> None:
    with Admin(node.endpoint) as admin:
        for params, named in [
            ({"limit": 0}, "limit"),
            ({"limit": 5001}, "limit"),
            ({"limit": "10"}, "limit"),
            ({"limit": True}, "limit"),
            ({"from": 7}, "from"),
            ({"prefix": ["a"]}, "prefix"),
            ({"page": 10}, "page"),
        ]:
            with pytest.raises(BadParameter, match=f"LIST_QUEUES.*'{named}'"):
                admin._call(Op.LIST_QUEUES, **params)
        with pytest.raises(BadParameter, match="limit"):
            next(admin.iter_queues(page=0))
        assert admin.ping()["node"]  # the node lives on


def test_long_names_end_a_page_by_bytes_and_an_old_client_gets_the_first_page(node) -> None:
    """1,800 names of 200 characters: 5000 would be ~450 KB of params here and about 1.5 MB at the
    largest figures, so the byte budget, not the limit, ends the page. An old client sends no
    params: it gets the first 1000 (the default limit) and a ``next`` it does not read."""
    names = [f"{i:04d}" + "n" * 196 for i in range(1800)]
    with Admin(node.endpoint, timeout_ms=30_000) as admin:
        for name in names:
            admin.create_queue(name)
        raw = admin._conn.request(Op.LIST_QUEUES, {})  # what a client from before paging sends
        assert [q["name"] for q in raw.params["queues"]] == names[:1000] and raw.params["next"] == names[1000]
        reply = _page(admin, limit=5000)
        got = [q["name"] for q in reply["queues"]]
        assert 1000 < len(got) < 1800 and got == names[: len(got)] and reply["next"] == names[len(got)]
        assert len(fr.encode_params(reply)) < 600 * 1024 < fr.PARAMS_BYTES_MAX
        assert [q["name"] for q in admin.iter_queues(page=5000)] == names
        assert [q["name"] for q in admin.list_queues()] == names
