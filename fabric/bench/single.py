"""`fabric bench`: producer process -> fabric node -> consumer process, end to end.

Every figure comes from real processes on loopback: the node is ``fabric up``
started as a subprocess (or an endpoint you name), the producer and consumer are
two more processes. Throughput is N / (consumer's last receive - producer's
start), both ``time.monotonic_ns()`` (one clock for the whole machine). Latency
runs send one message per ``send()`` at a fixed rate with ``linger_ms=0``; the
send time is in the first 8 bytes of the payload. Every loop is bounded by a
message count and a deadline.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from array import array
from typing import Any

from fabric.testing import Node

STAMP = struct.Struct("<q")
RUN_SECONDS_MAX = 120


def percentiles(samples: array | list[int]) -> dict[str, float]:
    if not samples:
        return {"p50_us": 0.0, "p90_us": 0.0, "p99_us": 0.0, "p999_us": 0.0, "max_us": 0.0}
    s = sorted(samples)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))] / 1000, 1)

    return {
        "p50_us": at(0.5),
        "p90_us": at(0.9),
        "p99_us": at(0.99),
        "p999_us": at(0.999),
        "max_us": round(s[-1] / 1000, 1),
    }


# ---------------------------------------------------------------------- worker processes


KEYS = 1000  # distinct keys in a key_shared throughput run


def _produce(endpoint: str, queue: str, opts: dict[str, Any], out: Any) -> None:
    from fabric.client import Producer

    n, size, mode = opts["messages"], opts["size"], opts["mode"]
    deadline = time.monotonic() + RUN_SECONDS_MAX
    linger = 0 if mode == "latency" else opts["linger_ms"]
    p = Producer(
        endpoint,
        acks=opts["acks"],
        linger_ms=linger,
        batch_bytes=opts["batch_bytes"],
        compression=opts["compression"],
        idempotent=opts.get("idempotent", True),
    )
    sent = 0
    lag = 0.0
    t_start = time.monotonic_ns()
    if mode == "throughput":
        payload = os.urandom(size) if opts["compression"] == "none" else b"x" * size
        send = p.send
        keys = [b"key-%d" % k for k in range(KEYS)] if opts.get("kind") == "key_shared" else None
        many = opts.get("send_many") or 0
        chunk = [payload] * many
        while sent < n:
            if many and keys is None:  # Producer.send_many, ``many`` values per call
                for _ in range(min(10_000, n - sent) // many):
                    p.send_many(queue, chunk)
                left = min(10_000, n - sent) % many
                if left:
                    p.send_many(queue, chunk[:left])
            elif keys is None:
                for _ in range(min(10_000, n - sent)):
                    send(queue, payload)
            else:  # key_shared: KEYS keys, round robin
                for i in range(min(10_000, n - sent)):
                    send(queue, payload, keys[(sent + i) % KEYS])
            sent += min(10_000, n - sent)
            if time.monotonic() > deadline:
                break
    else:
        pad = b"\0" * (size - 8)
        rate = opts["rate"]
        t0 = time.monotonic()
        while sent < n and time.monotonic() < deadline:
            due = t0 + sent / rate
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            else:
                lag = max(lag, now - due)
            p.send(queue, STAMP.pack(time.monotonic_ns()) + pad)
            sent += 1
    p.flush(60)
    t_end = time.monotonic_ns()
    p.close()
    out.put(
        {"sent": sent, "t_start": t_start, "t_end": t_end, "max_lag_s": round(lag, 4), "cpu_s": time.process_time()}
    )


def _consume(endpoint: str, queue: str, opts: dict[str, Any], ready: Any, out: Any) -> None:
    from fabric.client import Consumer

    n, mode = opts["messages"], opts["mode"]
    shared = opts.get("kind") in ("queue", "key_shared")
    if shared:  # SQS-style: every message leased, then acknowledged one by one (acks batched on the wire)
        c = Consumer(queue, endpoint, group="bench", kind=opts["kind"], start="earliest")
    else:  # a stream group that commits after every poll, as a user would run it (--no-commit: no group)
        commit = opts.get("commit", True)
        c = Consumer(queue, endpoint, start="earliest", group="bench" if commit else None)
    ready.set()
    got = nbytes = 0
    offset_errors = 0  # stream: every offset of every partition once, in order
    expect: dict[int, int] = {}
    lat = array("q")
    t_first = t_last = 0
    deadline = time.monotonic() + RUN_SECONDS_MAX
    commit_every_ns = opts.get("commit_interval_ms", 0) * 1_000_000  # 0: after every poll
    next_commit = 0
    unpack = STAMP.unpack_from
    while got < n and time.monotonic() < deadline:
        b = c.poll_batch(500)
        if b is None:
            continue
        t = time.monotonic_ns()
        if not t_first:
            t_first = t
        vals = b.values
        got += len(vals)
        nbytes += sum(map(len, vals))
        if shared:
            ack, part, base = c.ack_offset, b.partition, b.base_offset
            for i in range(len(vals)):
                ack(part, base + i)
        else:
            if expect.get(b.partition, 0) != b.base_offset:
                offset_errors += 1
            expect[b.partition] = b.base_offset + len(vals)
            if c.group is not None and t >= next_commit:
                c.commit()
                next_commit = t + commit_every_ns
        if mode == "latency":
            lat.extend(t - unpack(v)[0] for v in vals)
        t_last = t
    c.close()
    out.put(
        {
            "received": got,
            "bytes": nbytes,
            "t_first": t_first,
            "t_last": t_last,
            "lat": lat.tobytes(),
            "cpu_s": time.process_time(),
            "offset_errors": offset_errors,
        }
    )


def _zmq_push(endpoint: str, n: int, size: int) -> None:
    import zmq

    s: zmq.Socket = zmq.Context.instance().socket(zmq.PUSH)
    s.connect(endpoint)
    payload = os.urandom(size)
    for _ in range(n):
        s.send(payload)
    s.close(linger=10_000)


def _zmq_baseline(n: int, size: int) -> dict[str, Any]:
    """Raw pyzmq PUSH -> PULL, one message per frame: the no-broker reference."""
    import zmq

    pull: zmq.Socket = zmq.Context.instance().socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    proc = mp.get_context("spawn").Process(target=_zmq_push, args=(f"tcp://127.0.0.1:{port}", n, size))
    t0 = time.monotonic_ns()
    proc.start()
    got = 0
    recv = pull.recv
    pull.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        while got < n:
            recv()
            got += 1
    except zmq.Again:
        pass
    t1 = time.monotonic_ns()
    proc.join(30)
    pull.close(0)
    secs = (t1 - t0) / 1e9
    return {"messages": got, "msgs_per_s": round(got / secs), "mb_per_s": round(got * size / secs / 1e6, 1)}


# ---------------------------------------------------------------------- one run


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (Linux /proc), 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _one_run(endpoint: str, opts: dict[str, Any], run_no: int, node_pid: int | None = None) -> dict[str, Any]:
    from fabric.client import Admin

    queue = f"bench-{os.getpid()}-{run_no}-{int(time.time())}"
    with Admin(endpoint) as admin:
        extra = {"replication_factor": opts["replication_factor"]} if opts.get("replication_factor") else {}
        reply = admin.create_queue(
            queue, partitions=opts["partitions"], fsync=opts["fsync"], retention_ms=3_600_000, **extra
        )
        if reply.get("placement"):  # a cluster: the clients talk to partition 0's leader, as Kafka's do
            leader = reply["placement"][0]["leader"]
            endpoint = admin.metadata()["nodes"].get(leader, endpoint)
    ctx = mp.get_context("spawn")
    out_p, out_c, ready = ctx.Queue(), ctx.Queue(), ctx.Event()
    consumer = ctx.Process(target=_consume, args=(endpoint, queue, opts, ready, out_c))
    consumer.start()
    if not ready.wait(30):
        consumer.kill()
        raise RuntimeError("bench consumer did not start")
    node_cpu0 = cpu_seconds(node_pid)
    producer = ctx.Process(target=_produce, args=(endpoint, queue, opts, out_p))
    producer.start()
    pres = out_p.get(timeout=RUN_SECONDS_MAX + 60)
    cres = out_c.get(timeout=RUN_SECONDS_MAX + 60)
    node_cpu = cpu_seconds(node_pid) - node_cpu0
    producer.join(10)
    consumer.join(10)
    unsettled = None
    with Admin(endpoint) as admin:
        if opts.get("kind") in ("queue", "key_shared"):  # every message acked: nothing left unsettled
            deadline = time.monotonic() + 5
            while True:
                g = admin.describe_queue(queue)["groups"].get("bench", {})
                unsettled = g.get("backlog", 0) + g.get("in_flight", 0)
                if not unsettled or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        admin.delete_queue(queue)
    secs = max(1e-9, (cres["t_last"] - pres["t_start"]) / 1e9)
    lat = array("q")
    lat.frombytes(cres["lat"])
    warm = len(lat) // 20 if opts["mode"] == "latency" else 0
    result = {
        "sent": pres["sent"],
        "received": cres["received"],
        "seconds": round(secs, 3),
        "msgs_per_s": round(cres["received"] / secs),
        "mb_per_s": round(cres["bytes"] / secs / 1e6, 1),
        "producer_msgs_per_s": round(pres["sent"] / max(1e-9, (pres["t_end"] - pres["t_start"]) / 1e9)),
        "max_lag_s": pres["max_lag_s"],
        "cpu_s_producer": round(pres["cpu_s"], 2),
        "cpu_s_node": round(node_cpu, 2),
        "cpu_s_consumer": round(cres["cpu_s"], 2),
    }
    if unsettled is not None:
        result["unsettled_after"] = unsettled
    if cres["offset_errors"]:
        result["offset_errors"] = cres["offset_errors"]
    if opts["mode"] == "latency":
        result.update(percentiles(lat[warm:]))
    return result


def run_bench(
    *,
    endpoint: str | None = None,
    progress: bool = False,
    compare_zmq: bool = False,
    runs: int = 1,
    transport: str = "zmq",
    auth: bool = False,
    quiet: bool = False,
    **opts: Any,
) -> dict[str, Any]:
    if opts["mode"] == "latency":
        opts["messages"] = int(opts["rate"] * opts["seconds"])
    node = tmp = None
    if endpoint is None:
        tmp = tempfile.mkdtemp(prefix="fabric-bench-")
        extra = _secure(tmp) if auth else None
        node = Node(tmp, stream="fabric://127.0.0.1:0" if transport == "stream" else None, extra=extra)
        endpoint = node.stream_endpoint if transport == "stream" else node.endpoint
    settings = {
        k: opts[k]
        for k in (
            "mode",
            "kind",
            "messages",
            "size",
            "batch_bytes",
            "linger_ms",
            "acks",
            "fsync",
            "compression",
            "partitions",
        )
    }
    settings["commit"] = opts.get("commit", True) and opts["kind"] == "stream"
    if settings["commit"] and opts.get("commit_interval_ms"):
        settings["commit_interval_ms"] = opts["commit_interval_ms"]
    if opts.get("send_many") and opts["mode"] == "throughput":
        settings["send_many"] = opts["send_many"]
    settings["auth"] = auth  # CurveZMQ on zmq, TLS on the stream transport
    if opts["mode"] == "latency":
        settings.update(rate=opts["rate"], linger_ms=0)
    if opts.get("replication_factor"):
        settings["replication_factor"] = opts["replication_factor"]
    if not quiet:  # quiet: the returned report is all (``fabric bench --json`` prints only it)
        print(f"fabric bench: {settings} against {endpoint}", file=sys.stderr)
    results = []
    try:
        for i in range(runs):
            r = _one_run(endpoint, opts, i, node.proc.pid if node is not None else None)
            results.append(r)
            if not quiet:
                _print_row(f"fabric run {i + 1}", r, opts["mode"])
    finally:
        if node is not None:
            node.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    median = {k: statistics.median(r[k] for r in results) for k in results[0] if isinstance(results[0][k], int | float)}
    if runs > 1 and not quiet:
        _print_row("fabric median", median, opts["mode"])
    report: dict[str, Any] = {"settings": settings, "runs": results, "median": median}
    if compare_zmq and opts["mode"] == "throughput":
        z = _zmq_baseline(opts["messages"], opts["size"])
        report["zmq_push_pull"] = z
        if not quiet:
            print(
                f"{'pyzmq PUSH/PULL':<16} {z['msgs_per_s']:>12,} msg/s {z['mb_per_s']:>9} MB/s   "
                "(1 msg per frame, no broker)"
            )
            print(f"fabric / raw pyzmq = {median['msgs_per_s'] / max(1, z['msgs_per_s']):.2f}")
    return report


def _secure(tmp: str) -> list[str]:
    """A keys dir with client "bench" (an admin) for the embedded node; this process and the
    producer and consumer it spawns use its credentials (CurveZMQ, or TLS on fabric://)."""
    from fabric.client import use_credentials
    from fabric.security import keys

    d = os.path.join(tmp, "keys")
    keys.init(d)
    keys.add_client(d, "bench")
    config = os.path.join(tmp, "bench.toml")
    with open(config, "w") as f:
        f.write(f'[security]\nkeys_dir = "{d}"\nadmins = ["bench"]\n')
    os.environ["FABRIC_CLIENT_CERT"] = os.path.join(d, "issued", "bench.key_secret")
    os.environ["FABRIC_SERVER_CERT"] = os.path.join(d, "server.key")
    use_credentials(os.environ["FABRIC_CLIENT_CERT"], os.environ["FABRIC_SERVER_CERT"])
    return ["--config", config, "--data-dir", os.path.join(tmp, "data")]  # the last --data-dir wins


def _print_row(label: str, r: dict[str, Any], mode: str) -> None:
    line = f"{label:<16} {int(r['msgs_per_s']):>12,} msg/s {r['mb_per_s']:>9} MB/s"
    line += f"   cpu s p/n/c {r['cpu_s_producer']}/{r['cpu_s_node'] or '-'}/{r['cpu_s_consumer']} in {r['seconds']} s"
    if r.get("offset_errors"):
        line += f"   OFFSET ERRORS: {r['offset_errors']}"
    if "unsettled_after" in r:
        line += f"   unsettled after the run: {r['unsettled_after']}"
    if mode == "latency":
        line += (
            f"   p50 {r['p50_us']} p90 {r.get('p90_us', '-')} p99 {r['p99_us']} p99.9 {r['p999_us']} us"
            f"  (max lag {r['max_lag_s']} s)"
        )
    print(line, flush=True)
