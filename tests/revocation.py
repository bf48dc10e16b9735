"""The revocation scenario, on whatever serves ``endpoint`` (a node's tcp:// or fabric:// port, a
cluster's router): two principals consume one queue in one group while an admin (``ops``)
produces without pause; one of them is revoked (what `fabric auth revoke` does, timed to the
moment its files move) and the test sees what each consumer received, and when, until a few
seconds after."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from fabric.client import Admin, Consumer, Producer, RecordFuture, use_credentials
from fabric.errors import NotAuthorized
from fabric.security import keys

GROUP = "workers"
BEFORE_S_MAX = 15.0  # to get the one to revoke receiving
AFTER_S = 3.0  # watched after the revoke
VISIBILITY_MS = 60_000  # far beyond the test: only an ended subscription gives its leases back in time


@dataclass
class Seen:
    values: dict[bytes, float] = field(default_factory=dict)  # value -> when it was first received
    refused_at: float | None = None
    refusal: str = ""


@dataclass
class Outcome:
    revoked_at: float
    revoked: Seen
    other: Seen
    sent: list[bytes]


def as_client(keys_dir: Path, name: str) -> None:
    use_credentials(str(keys_dir / "issued" / f"{name}.key_secret"), str(keys_dir / "server.key"))


def setup(keys_dir: Path, endpoint: str, queue: str, names: tuple[str, str], partitions: int = 2) -> None:
    """As ``ops`` (an admin of the config): the queue, and consume rights for both ``names``."""
    as_client(keys_dir, "ops")
    try:
        with Admin(endpoint, timeout_ms=10_000) as admin:
            admin.create_queue(queue, partitions=partitions)
            for name in names:
                admin.acl_add(name, "consume", queue)
                admin.acl_add(name, "consume", f"group:{GROUP}")
    finally:
        use_credentials(None, None)


def _poll(cons: Consumer, seen: Seen) -> None:
    if seen.refused_at is not None:
        return
    try:
        msgs = cons.poll(20)
    except NotAuthorized as exc:
        seen.refused_at, seen.refusal = time.monotonic(), exc.message
        return
    now = time.monotonic()
    for m in msgs:
        seen.values.setdefault(m.value, now)
    if msgs:
        cons.ack(msgs)  # asynchronous: one refused after the revoke leaves the message to the others


def revoke_while_consuming(keys_dir: Path, endpoint: str, queue: str, names: tuple[str, str]) -> Outcome:
    """``names[0]`` is revoked once both consumers receive; ``names[1]`` consumes on."""
    as_client(keys_dir, "ops")
    prod = Producer(endpoint, acks="leader")
    futures: list[tuple[bytes, RecordFuture]] = [(b"m0", prod.send(queue, b"m0"))]
    futures[0][1].result(10)  # connected as ops (a connection takes the credentials of its time)
    consumers = []
    for name in names:
        as_client(keys_dir, name)
        # credit for far more than the test sends: only the node ending the subscription stops its pushes
        consumers.append(Consumer(queue, endpoint, group=GROUP, kind="queue", visibility_ms=VISIBILITY_MS))
    r, o = Seen(), Seen()
    revoked_at = 0.0
    try:
        deadline = time.monotonic() + BEFORE_S_MAX
        while not revoked_at or time.monotonic() < revoked_at + AFTER_S:
            assert time.monotonic() < deadline, f"{names[0]} never received: {len(r.values)}"
            for i in range(len(futures), len(futures) + 10):
                futures.append((b"m%d" % i, prod.send(queue, b"m%d" % i, key=b"k%d" % (i % 7))))
            _poll(consumers[0], r)
            _poll(consumers[1], o)
            if not revoked_at and len(r.values) >= 50:
                keys.revoke(keys_dir, names[0])  # what `fabric auth revoke NAME` does
                revoked_at = time.monotonic()
                deadline = revoked_at + AFTER_S + 1
        prod.flush(30)
        sent = [v for v, f in futures if f.result(10).offset >= 0]
        deadline = time.monotonic() + 10  # the other gets the rest (what the revoked held unacked too)
        while not set(sent) <= r.values.keys() | o.values.keys() and time.monotonic() < deadline:
            _poll(consumers[1], o)
        return Outcome(revoked_at, r, o, sent)
    finally:
        for c in (prod, *consumers):
            c.close()
        use_credentials(None, None)


def check(out: Outcome, name: str) -> None:
    """0 messages reach the revoked consumer later than 1 s after the revoke, its poll raises
    NotAuthorized soon after, and the other gets everything else (the revoked one's unacked
    leases included, long before their visibility timeout)."""
    t0, r, o = out.revoked_at, out.revoked, out.other
    late = sorted(t - t0 for t in r.values.values() if t > t0 + 1.0)
    assert not late, f"{len(late)} message(s) reached {name} later than 1 s after the revoke: {late[:5]} s"
    assert r.refused_at is not None, f"{name} was never told"
    assert r.refused_at - t0 < 1.5, r.refused_at - t0
    assert f"'{name}'" in r.refusal, r.refusal
    after = [v for v, t in o.values.items() if t > t0 + 1.0]
    assert len(after) > 100, len(after)  # the producer kept sending and the other consumer got it
    missing = set(out.sent) - r.values.keys() - o.values.keys()
    assert not missing, f"{len(missing)} of {len(out.sent)} never delivered, e.g. {sorted(missing)[:5]}"
