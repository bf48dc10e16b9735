"""A registration under a lease (fabric.cluster.registration), as nodes and routers make it."""

from __future__ import annotations

from fabric.cluster.memetcd import MemoryEtcd
from fabric.cluster.registration import register, release

KEY = "/fabric/routers/r1"


def test_a_registration_creates_its_key_under_a_new_lease() -> None:
    m = MemoryEtcd()
    lease, revision = register(m, KEY, b"v", 0, 3)
    kv = m.get(KEY)
    assert lease and kv is not None and kv.lease == lease and kv.create_revision == revision


def test_a_live_registration_is_never_taken_and_the_new_lease_is_given_back() -> None:
    m = MemoryEtcd()
    first, _ = register(m, KEY, b"old", 0, 3)
    assert register(m, KEY, b"new", 0, 3) == (0, 0)
    assert m.lease_ids() == [first]
    m.advance(3000)  # the old lease lapses: the name is free again
    lease, _ = register(m, KEY, b"new", 0, 3)
    kv = m.get(KEY)
    assert lease and kv is not None and kv.value == b"new"


def test_a_try_whose_answer_was_lost_is_found_to_have_succeeded() -> None:
    m = MemoryEtcd()
    lease, revision = register(m, KEY, b"v", 0, 3)
    assert register(m, KEY, b"v", lease, 3) == (lease, revision)  # the same lease holds it


def test_release_gives_the_key_up_at_once_and_tolerates_no_lease() -> None:
    m = MemoryEtcd()
    lease, _ = register(m, KEY, b"v", 0, 3)
    release(m, lease)
    assert m.get(KEY) is None
    release(m, 0)
    m.set_available(False)
    release(m, 12345)  # etcd out of reach: the lease lapses by itself
