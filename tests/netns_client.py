"""The client side of the partition tests, run inside a client namespace (``ip netns exec``):
``python -m tests.netns_client COMMAND ...``; answers on stdout as JSON.

- ``etcd-healthy EP,EP,..``: wait until every etcd member reports a leader;
- ``status ETCD NAME NODES [ROUTERS]``: ``fabric cluster status`` as JSON;
- ``create ENDPOINTS QUEUE PARTITIONS``: create a queue, wait until every store knows it;
- ``load ENDPOINTS QUEUE PARTITIONS STOPFILE OUT``: acks=all writes of numbered messages until
  STOPFILE exists, through ENDPOINTS (the routers, or the stores); one JSON line per acknowledged
  message in OUT (wall-clock time, partition, sequence number, offset, and the endpoint the
  producer was connected to when the acknowledgement was read);
- ``produce ENDPOINT QUEUE PARTITION COUNT``: acks=all writes to that one store;
- ``read ENDPOINT QUEUE PARTITION``: every value in the partition, in order;
- ``serve``: the commands above (but ``load``) from stdin, one JSON list a line, each answered
  by one JSON line ``{"ok": ...}`` or ``{"error": ...}`` (no interpreter start per call).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from fabric.client import Admin, Consumer, Producer
from fabric.cluster.etcd_members import wait_healthy
from fabric.cluster.status import read_status
from fabric.errors import FabricError

WINDOW = 5  # messages in flight per partition
REQUEST_TIMEOUT_MS = 2500  # a request to a leader that went silent is given up after this


def create(endpoints: str, queue: str, partitions: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with Admin(endpoints, timeout_ms=5000) as admin:
                admin.create_queue(queue, partitions=partitions, if_not_exists=True)
            break
        except FabricError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    for e in endpoints.split(","):
        while True:
            try:
                with Admin(e, timeout_ms=2000) as admin:
                    detail = admin.describe_queue(queue)["partition_detail"]
                if len(detail) == partitions:
                    break
            except FabricError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{e} does not know {queue} after 30 s")
            time.sleep(0.2)


def load(endpoints: str, queue: str, partitions: int, stopfile: str, out_path: str) -> None:
    """One thread per partition (a stalled partition does not hold up the others), one producer."""
    lock = threading.Lock()
    with Producer(endpoints, acks="all", request_timeout_ms=REQUEST_TIMEOUT_MS) as prod, open(out_path, "a") as out:

        def one(p: int) -> None:
            seq = p
            while not os.path.exists(stopfile):
                batch = []
                for _ in range(WINDOW):
                    seq += partitions
                    batch.append((seq, prod.send(queue, b"%d" % seq, partition=p)))
                for s, fut in batch:
                    try:
                        meta = fut.result(30)
                    except FabricError:
                        continue  # not acknowledged: may or may not be stored
                    line = {"t": time.time(), "p": p, "seq": s, "offset": meta.offset, "via": prod.connected_to}
                    with lock:
                        out.write(json.dumps(line) + "\n")
                        out.flush()

        threads = [threading.Thread(target=one, args=(p,)) for p in range(partitions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def produce(endpoint: str, queue: str, partition: int, count: int) -> dict[str, Any]:
    """``count`` acks=all writes to one store only; how long they took and their values."""
    values = [f"direct-{time.time_ns()}-{i}" for i in range(count)]
    t0 = time.monotonic()
    with Producer(endpoint, acks="all", request_timeout_ms=10_000) as prod:
        futs = [prod.send(queue, v.encode(), partition=partition) for v in values]
        for f in futs:
            f.result(15)
    return {"seconds": time.monotonic() - t0, "values": values}


def read(endpoint: str, queue: str, partition: int) -> list[str]:
    values: list[str] = []
    with Consumer(queue, endpoint=endpoint, partitions=[partition], start="earliest") as cons:
        offset = 0
        while True:
            got = cons.fetch(partition, offset, max_bytes=4 << 20)
            if not got:
                return values
            values.extend(m.value.decode() for m in got)
            offset = got[-1].offset + 1


def command(cmd: str, args: list[str]) -> object:
    if cmd == "etcd-healthy":
        wait_healthy(args[0].split(","), 30)
        return None
    if cmd == "status":
        routers = args[3].split(",") if len(args) > 3 and args[3] else []
        return read_status(args[0].split(","), args[1], args[2].split(","), routers)
    if cmd == "create":
        create(args[0], args[1], int(args[2]))
        return None
    if cmd == "produce":
        return produce(args[0], args[1], int(args[2]), int(args[3]))
    if cmd == "read":
        return read(args[0], args[1], int(args[2]))
    raise SystemExit(f"unknown command {cmd!r}")


def serve() -> None:
    for line in sys.stdin:
        cmd, *args = json.loads(line)
        try:
            answer: dict[str, object] = {"ok": command(cmd, args)}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "load":
        load(args[0], args[1], int(args[2]), args[3], args[4])
    elif cmd == "serve":
        serve()
    else:
        print(json.dumps(command(cmd, args)))


if __name__ == "__main__":
    main(sys.argv[1:])
