"""`fabric bench`, `fabric bench-cluster`, `fabric bench-direct`: the benchmarks in :mod:`fabric.bench`."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from fabric.cli.common import JSON


@click.command()
@click.option(
    "--endpoint", "-e", envvar="FABRIC_ENDPOINT", help="Bench a running node (default: start a fresh embedded one)."
)
@click.option("--mode", type=click.Choice(["throughput", "latency"]), default="throughput", show_default=True)
@click.option("--messages", "-n", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--size", type=click.IntRange(min=8), default=100, show_default=True)
@click.option("--batch-bytes", type=click.IntRange(min=1), default=256 * 1024, show_default=True)
@click.option("--linger-ms", type=float, default=5, show_default=True)
@click.option("--acks", type=click.Choice(["none", "leader", "all"]), default="leader", show_default=True)
@click.option("--fsync", type=click.Choice(["always", "interval", "never"]), default="always", show_default=True)
@click.option("--compression", type=click.Choice(["none", "lz4"]), default="none", show_default=True)
@click.option("--partitions", type=click.IntRange(1, 4096), default=1, show_default=True)
@click.option(
    "--replication-factor",
    type=click.IntRange(0, 16),
    default=0,
    show_default=True,
    help="Against a cluster (-e): replicas of the bench queue (0: the cluster's default).",
)
@click.option(
    "--kind",
    type=click.Choice(["stream", "queue", "key_shared"]),
    default="stream",
    show_default=True,
    help="queue: a queue subscription that leases and acks every message; key_shared: the same, 1,000 keys.",
)
@click.option(
    "--idempotent/--no-idempotent", default=True, show_default=True, help="Idempotent producer (the default)."
)
@click.option(
    "--commit/--no-commit",
    default=True,
    show_default=True,
    help="stream: the consumer is a group member that commits after every poll, as a user would run it.",
)
@click.option(
    "--commit-interval-ms",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="stream, with --commit: commit after a poll only when this long has passed since the last "
    "commit (0: after every poll).",
)
@click.option(
    "--rate", type=click.IntRange(min=1), default=5000, show_default=True, help="Latency mode: messages per second."
)
@click.option("--seconds", type=float, default=10, show_default=True, help="Latency mode: how long.")
@click.option(
    "--send-many",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Throughput mode: the producer calls Producer.send_many with this many values per call "
    "(the bulk form of send; as the harness pipelines) instead of one send per value (0).",
)
@click.option("--runs", type=click.IntRange(min=1), default=1, show_default=True, help="Repeat and report the median.")
@click.option("--compare-zmq", is_flag=True, help="Also measure raw pyzmq PUSH/PULL in the same run.")
@click.option(
    "--transport",
    type=click.Choice(["zmq", "stream"]),
    default="zmq",
    show_default=True,
    help="The embedded node's transport for the clients: zmq (tcp://) or stream (fabric://).",
)
@click.option("--auth", is_flag=True, help="The embedded node authenticates: CurveZMQ on zmq, TLS on stream.")
@JSON
def bench(as_json: bool, **opts: Any) -> None:
    """Producer -> fabric -> consumer end to end: msgs/s, MB/s, latency p50/p99/p999."""
    from fabric.bench.single import run_bench

    result = run_bench(**opts, progress=not as_json and sys.stderr.isatty(), quiet=as_json)
    if as_json:
        click.echo(json.dumps(result, indent=2))


@click.command("bench-cluster")
@click.option("--messages", "-n", type=click.IntRange(min=1000), default=300_000, show_default=True)
@click.option("--size", type=click.IntRange(min=1), default=100, show_default=True, help="Payload bytes.")
@click.option("--acks", type=click.Choice(["none", "leader", "all"]), default="all", show_default=True)
@click.option("--stores", type=click.IntRange(1, 9), default=3, show_default=True, help="Storage nodes.")
@click.option("--routers", type=click.IntRange(1, 9), default=2, show_default=True)
@click.option("--rf", type=click.IntRange(1, 9), default=3, show_default=True, help="Replication factor.")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Rounds of each; medians.")
@click.option(
    "--federation",
    is_flag=True,
    help="Also through a second cluster's router (a federation on the same etcd: the front door's redirect).",
)
@click.option(
    "--mode",
    type=click.Choice(["throughput", "latency"]),
    default="throughput",
    show_default=True,
    help="latency: one producer, one partition, one message per send at --rate; acknowledgement "
    "latency through the routers, to the leader and to a single node.",
)
@click.option(
    "--rate", type=click.IntRange(min=1), default=5000, show_default=True, help="Latency mode: messages per second."
)
@click.option("--seconds", type=float, default=10, show_default=True, help="Latency mode: seconds per round.")
@click.option(
    "--partitions",
    type=click.IntRange(0, 64),
    default=0,
    show_default=True,
    help="Throughput mode: partitions, one producer each (0: one per store).",
)
@click.option(
    "--single",
    is_flag=True,
    help="Throughput mode: also a single node (fabric up, RF 1) beside the cluster, the same "
    "partitions and producers, in the same rotation (latency mode always has one).",
)
@JSON
def bench_cluster(as_json: bool, **opts: Any) -> None:
    """Produce throughput through the router tier and straight to the leaders, side by side, on a
    cluster started for the run on loopback (etcd members, stores, routers; removed at the end)."""
    from fabric.bench.cluster import run_cluster_bench

    if opts["rf"] > opts["stores"]:
        raise click.UsageError("--rf may not exceed --stores")
    result = run_cluster_bench(**opts, progress=not as_json)
    if as_json:
        click.echo(json.dumps(result, indent=2))


@click.command("bench-direct")
@click.option("--messages", "-n", type=click.IntRange(min=100), default=20_000, show_default=True)
@click.option("--size", type=click.IntRange(min=8), default=100, show_default=True, help="Payload bytes.")
@click.option("--rate", type=click.IntRange(min=1), default=5000, show_default=True, help="Messages per second.")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Rounds of each; medians.")
@JSON
def bench_direct(as_json: bool, **opts: Any) -> None:
    """One-way latency of a direct (brokerless) queue against raw pyzmq PUSH/PULL, side by side."""
    from fabric.bench.direct import run_direct_bench

    result = run_direct_bench(**opts, progress=not as_json)
    if as_json:
        click.echo(json.dumps(result, indent=2))
