"""Failover through the routers without stalls (issue 31): a store killed or paused under a
producer that was given only the routers. The router answers what it had forwarded to the lost
store at once (NOT_LEADER), so the producer resends to the new leader instead of waiting out its
request timeout (30 s)."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from collections.abc import Callable

import pytest

from fabric.client import Admin, Consumer, Producer
from tests.cluster_procs import ClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.integration]
PARTITIONS = 3


def _acks_across(c: ClusterProcs, queue: str, fault: Callable[[], None], seconds: float) -> dict:
    """A producer through the routers sending ``acks=all`` to every partition for ``seconds``,
    ``fault()`` run one second in; per partition the acknowledgement times, and what failed."""
    acked: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
    values: list[bytes] = []
    errors: list[BaseException] = []
    prod = Producer(c.all_routers, acks="all", linger_ms=2)  # the default request timeout: 30 s

    def done(p: int) -> Callable[[object, BaseException | None], None]:
        return lambda md, exc: acked[p].append(time.monotonic()) if exc is None else errors.append(exc)

    def produce() -> None:
        try:
            deadline = time.monotonic() + seconds
            i = 0
            while time.monotonic() < deadline:
                for p in range(PARTITIONS):
                    v = b"v%d" % i
                    values.append(v)
                    prod.send(queue, v, partition=p, callback=done(p))
                    i += 1
                time.sleep(0.005)
            prod.flush(60)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(daemon=True, target=produce)
    t.start()
    time.sleep(1.0)
    fault_at = time.monotonic()
    fault()
    t.join(seconds + 90)
    prod.close()
    assert not t.is_alive(), "the producer never finished"
    assert not errors, errors[:3]
    return {"acked": acked, "values": values, "fault_at": fault_at}


def _longest_pause(run: dict) -> float:
    """The longest time any partition went without an acknowledgement after the fault."""
    worst = 0.0
    for p, times in run["acked"].items():
        after = [t for t in times if t > run["fault_at"]]
        assert after, f"partition {p}: nothing acknowledged after the fault"
        gaps = [b - a for a, b in itertools.pairwise([run["fault_at"], *after])]
        worst = max(worst, *gaps)
    return worst


def _all_stored_once(c: ClusterProcs, queue: str, values: list[bytes]) -> None:
    seen: list[bytes] = []
    with Consumer(queue, c.all_routers, start="earliest") as cons:
        deadline = time.monotonic() + 30
        while len(seen) < len(values) and time.monotonic() < deadline:
            b = cons.poll_batch(5000)
            if b is not None:
                seen.extend(b.values)
    assert len(seen) == len(values) and set(seen) == set(values), (len(seen), len(values))


def _setup(c: ClusterProcs, queue: str) -> None:
    with Admin(c.all_routers, timeout_ms=10_000) as admin:
        admin.create_queue(queue, partitions=PARTITIONS)
    c.wait(lambda s: sum(1 for p in s["partitions"] if p["queue"] == queue and p["leader"]) == PARTITIONS)


def test_a_killed_leader_stalls_no_partition_past_three_seconds(routed: ClusterProcs) -> None:
    _setup(routed, "kq")
    victim = routed.leader("kq", 0)
    assert victim is not None
    run = _acks_across(routed, "kq", lambda: routed.kill9(victim), 5.0)
    pause = _longest_pause(run)
    print(f"kill -9 {victim}: longest pause in acknowledgements on any partition {pause:.2f} s")
    assert pause < 3.0, f"writes stalled {pause:.2f} s after the leader was killed"
    _all_stored_once(routed, "kq", run["values"])


def test_a_paused_leader_stalls_writes_no_longer_than_its_lease(routed: ClusterProcs) -> None:
    _setup(routed, "pq")
    victim = routed.leader("pq", 0)
    assert victim is not None

    def pause_for_a_while() -> None:
        routed.signal(victim, signal.SIGSTOP)
        threading.Timer(6.0, routed.signal, (victim, signal.SIGCONT)).start()

    run = _acks_across(routed, "pq", pause_for_a_while, 9.0)
    pause = _longest_pause(run)
    bound = routed.lease_ttl_s + 1.5
    print(f"SIGSTOP {victim} for 6 s: longest pause in acknowledgements on any partition {pause:.2f} s")
    assert pause < bound + 0.5, f"writes stalled {pause:.2f} s behind a paused leader (lease {routed.lease_ttl_s} s)"
    _all_stored_once(routed, "pq", run["values"])
