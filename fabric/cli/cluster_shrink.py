"""`fabric cluster shrink`: empty the store whose removal frees the most (fabric/cluster/removal.py
plans it; the moves are the replica moves `fabric cluster drain` writes)."""

from __future__ import annotations

from typing import Any

import click

from fabric.cli.cluster import _move_opts, _open_meta, _run_moves, _target, _where
from fabric.cli.common import JSON


@click.command("shrink")
@_where
@_move_opts
@click.option(
    "--headroom",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.2,
    show_default=True,
    help="Free disk a store receiving replicas must keep (a fraction of its disk).",
)
@click.option(
    "--max-replicas-per-store",
    "replicas_max",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="No receiving store ends above this many replicas (0: no cap).",
)
@JSON
def shrink(
    config_path: str | None,
    etcd_urls: str | None,
    cluster_name: str | None,
    dry_run: bool,
    wait: bool,
    timeout_s: float,
    headroom: float,
    replicas_max: int,
    as_json: bool,
) -> None:
    """Empty the store whose removal frees the most (bytes, then replicas) among those whose
    replicas can all move to the other live stores within headroom (each partition keeps its
    replication factor; receivers keep --headroom of their disk free and stay under
    --max-replicas-per-store). With --wait, follow the moves until it holds no replica: then stop
    its process and take its [[cluster.nodes]] entry out of the config; it leaves the cluster when
    its registration lease runs out."""
    from fabric.cluster.rebalance import read_map
    from fabric.cluster.removal import Disk, choose, plan_drains
    from fabric.federation.report import read_loads

    urls, name, _ = _target(config_path, etcd_urls, cluster_name)
    meta = _open_meta(urls, name)
    try:
        cmap = read_map(meta)
        disks = {n: Disk(x.disk_used_bytes, x.disk_free_bytes) for n, x in read_loads(meta).items()}
        sizes = _partition_sizes(cmap)
        drains = plan_drains(
            cmap.partitions,
            list(cmap.nodes),
            disks=disks,
            sizes=sizes,
            busy=set(cmap.moves),
            headroom=headroom,
            replicas_max=replicas_max,
        )
        best = choose(drains)
        if best is None:
            reasons = "; ".join(f"{d.store}: {d.problem or 'holds no replica'}" for d in drains)
            raise click.ClickException(f"no store can be emptied onto the others within headroom ({reasons})")
        if not as_json:
            click.echo(f"shrink: {best.store} frees the most ({best.replicas} replica(s), {best.bytes:,} bytes)")
        _run_moves(meta, list(best.moves), cmap, dry_run, wait, timeout_s, as_json, f"drain {best.store}")
        if wait and not dry_run:
            left = [k for k, r in read_map(meta).partitions.items() if best.store in r.replicas]
            if left:
                raise click.ClickException(f"{best.store} still holds {len(left)} replica(s): {left[:5]}")
            if not as_json:
                click.echo(
                    f"{best.store} holds no replica: stop its process and remove its [[cluster.nodes]] entry; "
                    "it leaves the cluster when its lease runs out"
                )
    finally:
        meta.close()


def _partition_sizes(cmap: Any) -> dict[tuple[str, int], int]:
    """Each partition's bytes on its leader (queues described once per leader; unknown: left out)."""
    from fabric.client import Admin
    from fabric.errors import FabricError

    sizes: dict[tuple[str, int], int] = {}
    asked: set[tuple[str, str]] = set()
    for (queue, _), rec in sorted(cmap.partitions.items()):
        info = cmap.nodes.get(rec.leader) if rec.leader else None
        if info is None or (info.endpoint, queue) in asked:
            continue
        asked.add((info.endpoint, queue))
        try:
            with Admin(info.endpoint, timeout_ms=5000) as admin:
                detail = admin.describe_queue(queue)["partition_detail"]
        except FabricError:
            continue
        for x in detail:
            key = (queue, x["partition"])
            here = cmap.partitions.get(key)
            if here is not None and here.leader == rec.leader and isinstance(x.get("size_bytes"), int):
                sizes[key] = x["size_bytes"]
    return sizes
