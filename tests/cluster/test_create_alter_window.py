"""Create, alter and use without a window, on real processes: three `fabric node start` stores and
two `fabric router start` routers on 127.0.0.1 against the run's etcd.

* A queue created through a router is used at once through every router and every store: no
  UNKNOWN_QUEUE, no subscription that misses a partition, no failed send.
* `alter --partitions` 2 -> 4 -> 6 under two keyed producers (one per router): no send fails
  (a batch for a partition some node has not heard of yet waits for the map, or is retried by
  the producer), and every acknowledged message is consumed.
"""

from __future__ import annotations

import threading
import time

import pytest

from fabric.client import Admin, Consumer, Producer
from fabric.errors import UnknownPartition, UnknownQueue
from tests.cluster_procs import ClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

ROUNDS = 10  # queues created and used at once (each through all 5 endpoints)


def _read(cons: Consumer, want: int, seconds: float) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while len(got) < want and time.monotonic() < deadline:
        got.extend(m.value for m in cons.poll(100))
    return got


def test_a_queue_created_through_a_router_is_served_at_once_everywhere(routed: ClusterProcs) -> None:
    endpoints = [*routed.endpoints.values(), *routed.router_endpoints.values()]
    routers = list(routed.router_endpoints.values())
    producers = [Producer(e, acks="all", spread=False) for e in endpoints]
    admins = [Admin(e) for e in endpoints]
    failures: list[str] = []
    try:
        for i in range(ROUNDS):
            queue = f"fresh{i}"
            admins[len(routed.endpoints) + i % len(routers)].create_queue(queue, partitions=2)
            # at once, through every store and router: look it up, subscribe, send, describe
            for e, admin in zip(endpoints, admins, strict=True):
                try:
                    assert len(admin.metadata([queue])["queues"].get(queue, [])) == 2
                except Exception as exc:
                    failures.append(f"round {i}: METADATA through {e}: {exc!r}")
            consumers = [Consumer(queue, e, start="earliest", heartbeat_ms=300) for e in endpoints]
            try:
                futs = [
                    (e, p.send(queue, b"%d:%s:%d" % (i, e.encode(), k), key=b"k%d" % k))
                    for e, p in zip(endpoints, producers, strict=True)
                    for k in range(4)
                ]
                for e, f in futs:
                    try:
                        f.result(15)
                    except Exception as exc:
                        failures.append(f"round {i}: send through {e}: {exc!r}")
                for e, admin in zip(endpoints, admins, strict=True):
                    try:
                        assert admin.describe_queue(queue)["partitions"] == 2
                    except Exception as exc:
                        failures.append(f"round {i}: describe through {e}: {exc!r}")
                want = 4 * len(endpoints)
                for e, cons in zip(endpoints, consumers, strict=True):
                    got = _read(cons, want, 10)
                    if len(got) != want:
                        failures.append(f"round {i}: consumer through {e} got {len(got)} of {want}")
            finally:
                for cons in consumers:
                    cons.close()
        assert not failures, failures
        # a partition or queue that is not there is refused at once (one etcd read), not waited for
        for e, admin in zip(endpoints, admins, strict=True):
            started = time.monotonic()
            with pytest.raises(UnknownPartition):
                admin.list_offsets("fresh0", 9)
            with pytest.raises(UnknownQueue):
                admin.list_offsets("never-made", 0)
            assert time.monotonic() - started < 1.5, e
    finally:
        for p in producers:
            p.close(10)
        for admin in admins:
            admin.close()


def test_partitions_added_under_two_keyed_producers_fail_no_send(routed: ClusterProcs) -> None:
    routers = list(routed.router_endpoints.values())
    with Admin(routers[0]) as admin:
        admin.create_queue("grow", partitions=2)
    acked: list[bytes] = []
    failed: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def produce(n: int, endpoint: str) -> None:
        def done(meta, err, value):  # type: ignore[no-untyped-def]
            with lock:
                if err is None:
                    acked.append(value)
                else:
                    failed.append(f"{value!r}: {err!r}")

        with Producer(endpoint, acks="all", spread=False, linger_ms=2) as prod:
            i = 0
            while not stop.is_set() and i < 200_000:
                value = b"p%d-%d" % (n, i)
                prod.send("grow", value, key=b"k%d" % (i % 64), callback=lambda m, e, v=value: done(m, e, v))
                i += 1
                if i % 50 == 0:
                    time.sleep(0.005)
            prod.flush(30)

    threads = [threading.Thread(target=produce, args=(n, e)) for n, e in enumerate(routers)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        with Admin(routers[1]) as admin:
            assert admin.alter_queue("grow", partitions=4)["added"] == 2
            time.sleep(0.7)
            assert admin.alter_queue("grow", partitions=6)["added"] == 2
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not failed, (len(failed), failed[:5])
    assert len(acked) > 1000
    with Consumer("grow", routers[0], start="earliest") as cons:
        got = _read(cons, len(acked), 30)
    assert sorted(set(got)) == sorted(acked), (len(got), len(acked))
    with Admin(routers[0]) as admin:
        assert admin.describe_queue("grow")["partitions"] == 6
