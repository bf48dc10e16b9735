"""The ready signal of `fabric up`, `fabric node start` and `fabric router start`, and the
cluster start that waits for it.

Every one of them says it is ready the same way: a sentence (the default), one JSON line on
stdout (``--json``: an object with ``event: "ready"``, ``version``, ``pid``, the process's
endpoints, ...) and/or the same object in a file (``--ready-file``: written to a temp file,
fsynced, renamed over the name, the directory fsynced; removed at a clean stop). A process says
so only once it can serve: a node when it is registered in etcd, a router when it is registered,
`fabric up --config` when the whole cluster is ready (``fabric.cluster.readiness``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fabric import __version__
from fabric.cli.progress import Progress
from fabric.errors import FabricError
from fabric.logs import configure as configure_logs

READY_POLL_S = 0.05  # a node or router looks this often whether it has registered
REGISTER_NOTE_S = 5.0  # not registered after this long: say so on stderr (etcd down?)
PROBE_TIMEOUT_MS = 500  # one PING through a router to a store


def write_ready_file(path: Path, text: str) -> None:
    """``text`` in ``path``, whole or not at all: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def announce_ready(info: dict[str, Any], as_json: bool, ready_file: str | None) -> None:
    """The machine-readable ready signal: a JSON line on stdout and/or a file written atomically."""
    text = json.dumps(info, separators=(",", ":"))
    if ready_file:
        write_ready_file(Path(ready_file), text + "\n")
    if as_json:
        click.echo(text)
        sys.stdout.flush()


class Announcer:
    """Announce once ``is_ready()`` holds (a thread looks every READY_POLL_S): the JSON line and
    ready file of ``info()``, or the sentence ``human(info)``. ``close()`` at the stop: nothing is
    announced after it, and the ready file is removed."""

    def __init__(
        self,
        what: str,
        is_ready: Callable[[], bool],
        info: Callable[[], dict[str, Any]],
        human: Callable[[dict[str, Any]], str],
        *,
        as_json: bool,
        ready_file: str | None,
    ) -> None:
        self.what = what
        self._is_ready, self._info, self._human = is_ready, info, human
        self._as_json, self._ready_file = as_json, ready_file
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._wait, name="fabric-ready", daemon=True).start()

    def _wait(self) -> None:
        started = time.monotonic()
        noted = False
        while not self._closed.wait(READY_POLL_S):
            if self._is_ready():
                break
            if not noted and time.monotonic() - started > REGISTER_NOTE_S:
                click.echo(f"{self.what}: not registered in etcd yet; waiting (is etcd up?)", err=True)
                noted = True
        with self._lock:
            if self._closed.is_set():
                return
            info = self._info()
            announce_ready(info, self._as_json, self._ready_file)
            if not self._as_json:
                click.echo(self._human(info))
                sys.stdout.flush()

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            if self._ready_file:
                Path(self._ready_file).unlink(missing_ok=True)


def run_announced(
    serve: Callable[[Callable[[Any], None]], None], announcer_for: Callable[[Any], Announcer], ready_file: str | None
) -> None:
    """``serve(on_ready)`` in the foreground (a node's or a router's ``run``); when it is ready the
    announcer ``announcer_for(process)`` makes starts, and it is closed at the end (removing the
    ready file; a start that never got ready removes a stale one too)."""
    announcer: Announcer | None = None

    def ready(process: Any) -> None:
        nonlocal announcer
        announcer = announcer_for(process)
        announcer.start()

    try:
        serve(ready)
    finally:
        if announcer is not None:
            announcer.close()
        elif ready_file:
            Path(ready_file).unlink(missing_ok=True)


class RouterProbe:
    """``reaches(router_endpoint, store)``: a PING through the router naming the store, answered
    by that store (``fabric.cluster.readiness``). One admin connection per router, kept."""

    def __init__(self) -> None:
        self._admins: dict[str, Any] = {}

    def __call__(self, endpoint: str, store: str) -> bool:
        from fabric.client import Admin

        admin = self._admins.get(endpoint)
        try:
            if admin is None:
                admin = self._admins[endpoint] = Admin(endpoint, timeout_ms=PROBE_TIMEOUT_MS)
            return bool(admin.ping(node=store).get("node") == store)
        except FabricError:
            self._drop(endpoint)
            return False

    def _drop(self, endpoint: str) -> None:
        admin = self._admins.pop(endpoint, None)
        if admin is not None:
            admin.close()

    def close(self) -> None:
        for endpoint in list(self._admins):
            self._drop(endpoint)


def up_cluster(
    config_path: str, config: Any, as_json: bool = False, ready_file: str | None = None, ready_timeout_s: float = 60.0
) -> None:
    """`fabric up --config CLUSTER.toml`: start and supervise every process of the cluster; say
    it is ready once it is (progress lines on stderr meanwhile); exit 1 naming what is missing
    when it is not ready in ``ready_timeout_s``."""
    from fabric.cluster.supervisor import run as run_cluster

    configure_logs(config.log_level, config.log_format, "supervisor")
    cl = config.cluster
    started = time.monotonic()
    probe = RouterProbe()
    # with authentication on, a PING through a router needs a client's credentials (env)
    reaches = probe if not config.security.keys_dir or os.environ.get("FABRIC_CLIENT_CERT") else None

    def progress(missing: str) -> None:
        click.echo(f"waiting for the cluster: {missing}", err=True)

    def ready(sup: Any) -> None:
        probe.close()
        info = {
            "event": "ready",
            "version": __version__,
            "cluster": True,
            "name": cl.name,
            "nodes": [{"node": n.node_id, "endpoint": n.listen} for n in cl.nodes],
            "routers": [{"router": r.router_id, "endpoint": r.listen} for r in cl.routers],
            "etcd": list(cl.etcd),
            "pid": os.getpid(),
            "data_dir": str(Path(cl.data_dir).resolve()),
            "ready_ms": int((time.monotonic() - started) * 1000),
        }
        announce_ready(info, as_json, ready_file)
        if as_json:
            return
        click.echo(
            f"fabric {__version__} cluster up: {len(cl.etcd_members)} etcd member(s), {len(cl.nodes)} node(s) "
            f"({', '.join(n.node_id + ' ' + n.listen for n in cl.nodes)}) registered, a controller elected"
            f"{', every router reaching every store' if cl.routers else ''}; "
            f"logs and PIDs in {Path(cl.data_dir).resolve()}"
        )
        if cl.routers:
            endpoints = ",".join(r.listen for r in cl.routers)
            click.echo(f"routers: {', '.join(r.router_id + ' ' + r.listen for r in cl.routers)}")
            click.echo(f"clients: FABRIC_ENDPOINT={endpoints} (every router; a client moves to the next if one fails)")
        click.echo(f"status: fabric cluster status --config {config_path}    Ctrl-C stops everything.")
        sys.stdout.flush()

    stop_line = Progress(as_json)
    try:
        run_cluster(
            config_path,
            cl,
            on_ready=ready,
            reaches=reaches,
            ready_timeout_s=ready_timeout_s,
            progress=progress,
            stopping=lambda what: stop_line.update(f"stopping the cluster: {what}"),
        )
    finally:
        stop_line.close()
        probe.close()
        if ready_file:
            Path(ready_file).unlink(missing_ok=True)
    if not as_json:
        click.echo("fabric cluster stopped.")
