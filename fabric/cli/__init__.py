"""The ``fabric`` command: run a node, administer queues, send, receive, benchmark.

The executable only merges flags, a config file and defaults; the logic lives in
the library. Human tables by default, ``--json`` for scripts. Errors print as
``error: CODE_NAME: message`` on stderr with exit status 1.

One module per command or command group: ``up`` (up, ping), ``queue``, ``send``, ``recv``
(recv, tail), ``settle`` (ack, nack, change-visibility by receipt handle), ``groups`` (group, dlq), ``security`` (auth, acl, quota), ``cluster`` (node start,
router start, cluster), ``federation`` (federation status, and ``fabric up`` of a federation
config), ``top``, ``usage``, ``spark``, ``demo``, ``bench`` (bench, bench-cluster, bench-direct);
``ready`` is the ready signal and ``fabric up`` of a cluster config, ``common`` what they share. ``python -m fabric.cli`` runs ``__main__``.
"""

from __future__ import annotations

import click

from fabric import __version__
from fabric.cli import (
    bench,
    cluster,
    cluster_shrink,
    demo,
    federation,
    groups,
    queue,
    recv,
    security,
    send,
    settle,
    spark,
    top,
    up,
    usage,
)
from fabric.cli.common import _Group


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fabric")
def main() -> None:
    """fabric: a durable, fast message queue on ZeroMQ."""


for command in (
    up.up,
    up.ping,
    queue.queue,
    send.send,
    recv.recv,
    recv.tail,
    settle.ack,
    settle.nack,
    settle.change_visibility,
    demo.demo,
    bench.bench,
    bench.bench_cluster,
    bench.bench_direct,
    groups.group,
    groups.lag,
    usage.usage,
    top.top,
    groups.dlq,
    cluster.node,
    cluster.cluster,
    cluster.router,
    federation.federation,
    security.auth,
    security.acl,
    security.quota,
    spark.spark,
):
    main.add_command(command)
cluster.cluster.add_command(cluster_shrink.shrink)
