"""`fabric demo`: what a new user runs first, a real node, a real producer and consumer."""

from __future__ import annotations

import shutil
import tempfile
import time

from fabric.testing import Node


def run_demo(*, messages: int, size: int, data_dir: str | None) -> None:
    """What a new user runs first: a real node, a real producer and consumer."""
    from fabric.client import Admin, Consumer, Producer

    tmp = data_dir or tempfile.mkdtemp(prefix="fabric-demo-")
    node = Node(tmp)
    print(f"1. started an embedded fabric node on {node.endpoint} (data in {tmp})")
    try:
        with Admin(node.endpoint) as admin:
            admin.create_queue("demo", partitions=2, if_not_exists=True)
            print("2. created queue 'demo' (2 partitions, fsync always: acknowledged = on disk)")
            t0 = time.perf_counter()
            with Producer(node.endpoint) as producer:
                payload = b"x" * max(0, size - 12)
                futures = [producer.send("demo", b"%011d|" % i + payload) for i in range(messages)]
                producer.flush()
            last = futures[-1].result()
            t1 = time.perf_counter()
            print(
                f"3. sent {messages:,} messages of {size} B in {t1 - t0:.2f} s ({messages / (t1 - t0):,.0f} msg/s), all acknowledged; last at partition {last.partition} offset {last.offset}"
            )
            got = 0
            with Consumer("demo", node.endpoint, group="demo-readers", start="earliest") as consumer:
                while got < messages:
                    b = consumer.poll_batch(5000)
                    if b is None:
                        break
                    got += len(b)
                consumer.commit()
            t2 = time.perf_counter()
            print(
                f"4. received {got:,} messages pushed by the node in {t2 - t1:.2f} s ({got / (t2 - t1):,.0f} msg/s); committed group 'demo-readers'"
            )
            d = admin.describe_queue("demo")
            print(
                f"5. queue 'demo': {d['messages']:,} messages, {d['size_bytes']:,} bytes on disk, group lag {d['groups']['demo-readers']['total_lag']}"
            )
        if got != messages:
            raise SystemExit(f"demo FAILED: received {got} of {messages}")
        print(
            "demo OK: try `fabric up` in one terminal, then `fabric send demo hello` and `fabric recv demo` in another"
        )
    finally:
        node.stop()
        if data_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
