"""Cluster reports for the federation tests."""

from __future__ import annotations

from fabric.federation.directory import ClusterReport, Health, Utilisation


def report(
    name: str,
    *,
    stores: int = 3,
    under: int = 0,
    offline: int = 0,
    controller: str | None = "n1",
    epoch: int = 7,
    in_bps: float = 0.0,
    out_bps: float = 0.0,
    used: int = 10 * 2**30,
    free: int = 90 * 2**30,
    partitions: int = 0,
    published_ms: int = 1_000_000,
) -> ClusterReport:
    return ClusterReport(
        name,
        (f"tcp://127.0.0.1:{7000 + len(name)}",),
        Health(stores, under, offline, controller, epoch),
        Utilisation(in_bps, in_bps / 100, out_bps, out_bps / 100, used, free, partitions),
        published_ms,
    )
