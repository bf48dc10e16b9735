"""fabric adapter for the shared peer benchmark harness (../shared/bench, mqbench).

Run fabric side by side with Redis Streams, NATS JetStream, RabbitMQ and raw pyzmq:

    cd ../shared/bench
    PYTHONPATH=$OLDPWD ./run.sh --adapter-module tools.mqbench_fabric --cases fabric,redis_streams,zmq_batch

The per-run node is ``python3 -m tools.mqbench_fabric serve`` (the project's own
interpreter, found on PATH: the node needs sqlitedict and click, which the
harness's venv lacks); producer and consumer run in the harness's workers and
need only the client (pyzmq, lz4, crc32c, msgspec). The harness's venv has all but msgspec:
when it cannot be imported, this module adds the project's own venv's site-packages
(``.venv`` beside ``tools/``) at the end of ``sys.path``, so the harness's pinned packages still
come first. Settings: one partition, acks=leader,
fsync "always" by group commit (an acknowledged message is on disk, and
consumers see only what is on disk), linger 5 ms, 256 KiB batches.
``tools.mqbench_fabric_interval`` is the same with fsync every 100 ms (acks
after the write, not after fdatasync). ``tools.mqbench_fabric_stream`` and
``tools.mqbench_fabric_stream_interval`` are the two with clients on the stream
transport (``fabric://``: no ZeroMQ I/O threads) instead of the DEALER.
``tools.mqbench_fabric_send`` is the first with a producer that calls ``send()`` once per
message in the throughput case, as an application that has one message at a time does.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import time


def _client_packages() -> None:
    """msgspec from the project's venv when the running interpreter (the harness's) lacks it."""
    try:
        import msgspec  # noqa: F401
    except ImportError:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        major, minor = sys.version_info[:2]
        sys.path.extend(glob.glob(os.path.join(here, ".venv", "lib", f"python{major}.{minor}", "site-packages")))


_client_packages()

try:  # the harness's package; absent when this module runs as the node
    from mqbench import common
    from mqbench.adapters.base import Adapter, Recv, past
except ImportError:  # pragma: no cover - only in `serve` mode
    Adapter = object  # type: ignore[misc,assignment]

PORT = 37420
STREAM_PORT = PORT + 1
QUEUE = "mqbench"


class FabricAdapter(Adapter):  # type: ignore[misc,valid-type]
    latency = True
    probe_n = 1_000_000

    def __init__(self, fsync: str = "always", transport: str = "zmq", *, per_message: bool = False) -> None:
        self.fsync = fsync
        self.transport = transport
        self.per_message = per_message  # throughput: one send() per message instead of send_many
        stream = transport == "stream"
        self.name = (
            "fabric"
            + ("_stream" if stream else "")
            + ("" if fsync == "always" else f"_{fsync}")
            + ("_send" if per_message else "")
        )
        self.title = (
            f"fabric{' stream' if stream else ''} (acks=leader, fsync {fsync}{', send()' if per_message else ''})"
        )
        calls = "one send() per message" if per_message else "send_many of `batch` values per call"
        self.settings = {
            "transport": "fabric://127.0.0.1 (stream transport)" if stream else "tcp://127.0.0.1, DEALER -> ROUTER",
            "batching": f"{calls}, batches by linger 5 ms / 256 KiB (throughput); 1 msg per send, linger 0 (latency)",
            "durability": f"acks=leader; fsync={fsync} (always = group commit before ack and before delivery)",
            "partitions": 1,
        }

    def setup(self, run: dict) -> dict:
        scratch = os.path.join(common.SCRATCH, "fabric", run["run_id"])
        shutil.rmtree(scratch, ignore_errors=True)
        endpoint = f"fabric://127.0.0.1:{STREAM_PORT}" if self.transport == "stream" else f"tcp://127.0.0.1:{PORT}"
        return {"endpoint": endpoint, "data_dir": scratch}

    def aux_commands(self, run: dict, params: dict) -> list[list[str]]:
        python = os.environ.get("FABRIC_PYTHON") or shutil.which("python3") or "python3"
        return [[python, "-m", "tools.mqbench_fabric", "serve", params["data_dir"], str(PORT), self.fsync]]

    def teardown(self, run: dict, params: dict) -> dict | None:
        shutil.rmtree(params["data_dir"], ignore_errors=True)
        return None

    def produce(self, p: dict) -> dict:
        from fabric.client import Producer

        n, deadline = p["n"], p["deadline_ns"]
        cpu0 = common.cpu_seconds_self()
        res: dict = {}
        sent = 0
        if p["mode"] == "throughput":
            prod = Producer(p["endpoint"], acks="leader", linger_ms=5, batch_bytes=256 * 1024)
            payload = common.static_payload(p["size"])
            # ``batch`` values per call (the harness's pipelining size, as the Redis adapter
            # pipelines XADD): Producer.send_many, the bulk form of send
            batch = max(1, int(p.get("batch") or 100))
            send_many = prod.send_many
            chunk = [payload] * batch
            t_start = common.now_ns()
            if self.per_message:  # as an application with one message at a time writes it
                send = prod.send
                while sent < n:
                    for _ in range(min(10_000, n - sent)):
                        send(QUEUE, payload)
                    sent += min(10_000, n - sent)
                    if past(deadline):
                        break
            while sent < n and not self.per_message:
                k = min(batch, n - sent)
                send_many(QUEUE, chunk if k == batch else chunk[:k])
                sent += k
                if sent % 10_000 < batch and past(deadline):
                    break
        else:
            prod = Producer(p["endpoint"], acks="leader", linger_ms=0)
            pad = common.filler(p["size"])
            pacer = common.Pacer(p["rate"])
            t_start = common.now_ns()
            while sent < n and not past(deadline):
                pacer.wait(sent)
                for _ in range(pacer.due(sent)):
                    if sent >= n:
                        break
                    prod.send(QUEUE, common.stamped(sent, pad))
                    sent += 1
            res["max_lag_s"] = round(pacer.max_lag_s, 4)
        prod.flush(60)
        t_end = common.now_ns()
        prod.close()
        res.update(
            {
                "sent": sent,
                "acked": sent,
                "t_start": t_start,
                "t_end": t_end,
                "cpu_s": round(common.cpu_seconds_self() - cpu0, 3),
            }
        )
        return res

    def consume(self, p: dict, ready) -> dict:  # type: ignore[no-untyped-def]
        from fabric.client import Consumer

        # As a user runs it: a consumer group member that commits after every poll; every offset
        # is checked (a gap or a repeat counts as an error).
        c = Consumer(QUEUE, p["endpoint"], group="mqbench", start="earliest")
        ready()
        rc = Recv(p)
        n, deadline = rc.n, p["deadline_ns"]
        lat, latency_mode, sent_ts = rc.lat, rc.latency_mode, common.sent_ts
        got = nbytes = errors = expect = 0
        while got < n and not past(deadline):
            b = c.poll_batch(1000)
            if b is None:
                continue
            t = time.monotonic_ns()
            if rc.t_first is None:
                rc.t_first = t
            vals = b.values
            if b.base_offset != expect:
                errors += 1
            expect = b.base_offset + len(vals)
            got += len(vals)
            nbytes += sum(map(len, vals))
            if latency_mode:
                for v in vals:
                    lat.append(t - sent_ts(v))
            c.commit()
        rc.t_last = common.now_ns()
        rc.got, rc.nbytes, rc.errors = got, nbytes, errors
        c.close()
        return rc.result(p)


ADAPTER = FabricAdapter()


def _serve(data_dir: str, port: int, fsync: str) -> None:
    """The per-run node: one queue, READY on stdout once bound."""
    from fabric.node.server import run
    from fabric.settings import NodeConfig, QueueSettings

    config = NodeConfig(
        listen=f"tcp://127.0.0.1:{port}",
        stream_listen=f"fabric://127.0.0.1:{port + 1}",
        data_dir=data_dir,
        queues={QUEUE: QueueSettings(partitions=1, fsync=fsync, retention_ms=0)},
    )
    run(config, on_ready=lambda server: print("READY", flush=True))


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "serve":
    _serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
