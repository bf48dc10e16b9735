"""One SparkSession for the whole run, and real `fabric up` nodes on 127.0.0.1 (skipped without pyspark)."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Spark needs Java 17 (apt-get install openjdk-17-jre-headless)", allow_module_level=True)

from fabric.client import Admin, Producer
from fabric.testing import Node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RestartableNode:
    """A `fabric up` process on a fixed loopback port, so it can be killed and started again there."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.listen = f"tcp://127.0.0.1:{free_port()}"
        self.node = Node(data_dir, listen=self.listen)
        self.endpoint = self.node.endpoint

    def restart(self) -> None:
        self.node = Node(self.data_dir, listen=self.listen)

    def stop(self) -> None:
        self.node.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from fabric.spark.session import local_session
    from tests.session_groups import one_per_run

    one_per_run("spark", tmp_path_factory)

    session = local_session("fabric-tests", cores=2, shuffle_partitions=2)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def fabric_node(tmp_path_factory) -> Iterator[RestartableNode]:
    n = RestartableNode(str(tmp_path_factory.mktemp("fabric") / "data"))
    try:
        yield n
    finally:
        n.stop()


def produce(endpoint: str, queue: str, count: int, *, partitions: int = 4, start: int = 0) -> None:
    """``count`` messages ``m<i>`` keyed ``k<i % 97>`` into ``queue`` (created with ``partitions``)."""
    with Admin(endpoint) as a:
        a.create_queue(queue, if_not_exists=True, partitions=partitions)
    with Producer(endpoint, linger_ms=2) as p:
        for i in range(start, start + count):
            p.send(queue, b"m%d" % i, key=b"k%d" % (i % 97))
        p.flush(60)


def read_all(endpoint: str, queue: str) -> list[tuple[int, int, bytes | None, bytes, dict | None]]:
    """Every record of ``queue``: (partition, offset, key, value, headers), read with FETCH."""
    out = []
    with Admin(endpoint) as a:
        for row in a.describe_queue(queue)["partition_detail"]:
            p, offset, end = row["partition"], row["log_start_offset"], row["high_watermark"]
            while offset < end:
                batches, _ = a.fetch(queue, p, offset, max_bytes=8 << 20)
                for b in batches:
                    for m in b.messages():
                        if m.offset < end:
                            out.append((p, m.offset, m.key, m.value, m.headers))
                    offset = b.base_offset + len(b.values)
    return out


def wait_for(what, seconds: float, step: float = 0.1):
    """Call ``what`` until it returns something true or ``seconds`` pass; return its last result."""
    deadline = time.monotonic() + seconds
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(step)
