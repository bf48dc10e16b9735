"""``fabric up --config cluster.toml``: start every process a cluster config names and keep them up.

Theory of operation
-------------------
A cluster config lists etcd members (``[[cluster.etcd_members]]``, optional: etcd may run
elsewhere) and storage nodes (``[[cluster.nodes]]``). The supervisor starts the etcd members
first and waits until they answer, then one ``fabric node start CONFIG --node ID`` process per
node and one ``fabric router start CONFIG --router ID`` per router (``[[cluster.routers]]``):
each process is exactly what a service manager on another machine would run. Every child's
PID goes to ``<cluster.data_dir>/pids/<name>.pid`` and its output to ``logs/<name>.log``.

Then it waits until the cluster is ready (``fabric.cluster.readiness``: every store registered,
a controller elected, every router reaching every store), tending the children meanwhile, and
only then calls ``on_ready``; a cluster not ready in time is stopped and the start fails with
what is missing. Then it watches: a child that exits is started again after a backoff (1 s
doubling to 30 s, reset once it has run STABLE_S: a store killed after running a while is back
within about 2 s, one that crashes at start is not restarted in a tight loop), and the restart
is logged. SIGINT or SIGTERM stops the nodes
first (SIGTERM, then SIGKILL after a grace period), then the etcd members, and removes the PID
files. It stops only the processes it started, by PID.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fabric.cluster import etcd_members
from fabric.cluster.etcd import EtcdClient
from fabric.cluster.namespace import Namespaced
from fabric.cluster.readiness import Reaches, Readiness, judge, read_view
from fabric.errors import ConfigError, MetaUnavailable, Timeout
from fabric.settings import ClusterConfig

log = logging.getLogger("fabric.supervisor")
BACKOFF_S = (1.0, 30.0)
STABLE_S = 10.0  # a child up this long is no crash loop: its next restart waits only BACKOFF_S[0]
STOP_GRACE_S = 10.0


@dataclass
class Child:
    name: str
    kind: str  # "etcd", "node" or "router"
    argv: list[str]
    log_path: Path
    pid_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    backoff: float = BACKOFF_S[0]
    due: float = 0.0  # when a crashed child may start again
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,  # Ctrl-C in the terminal reaches the supervisor only
            )
        self.started = time.monotonic()
        self.pid_path.write_text(f"{self.proc.pid}\n")


class Supervisor:
    """The processes of one cluster config on this machine."""

    def __init__(
        self, config_path: str, cluster: ClusterConfig, *, nodes: list[str] | None = None, routers: bool = True
    ) -> None:
        self.config_path = str(Path(config_path).resolve())
        self.cluster = cluster
        root = Path(cluster.data_dir)
        self.root = root
        self._stop = threading.Event()
        self.children: list[Child] = []
        specs = [
            etcd_members.EtcdMemberSpec(m.name, m.data_dir, m.client_url, m.peer_url) for m in cluster.etcd_members
        ]
        for spec in specs:
            new = not (Path(spec.data_dir) / "member").exists()
            self.children.append(
                Child(
                    spec.name,
                    "etcd",
                    etcd_members.argv(spec, specs, new=new),
                    root / "logs" / f"{spec.name}.log",
                    root / "pids" / f"{spec.name}.pid",
                )
            )
        wanted = nodes or [n.node_id for n in cluster.nodes]
        for node_id in wanted:
            cluster.node(node_id)  # unknown names fail here, before anything starts
            self.children.append(
                Child(
                    node_id,
                    "node",
                    [sys.executable, "-m", "fabric.cli", "node", "start", self.config_path, "--node", node_id],
                    root / "logs" / f"{node_id}.log",
                    root / "pids" / f"{node_id}.pid",
                    env={"PYTHONUNBUFFERED": "1"},
                )
            )
        for r in cluster.routers if routers and nodes is None else ():
            self.children.append(
                Child(
                    r.router_id,
                    "router",
                    [sys.executable, "-m", "fabric.cli", "router", "start", self.config_path, "--router", r.router_id],
                    root / "logs" / f"{r.router_id}.log",
                    root / "pids" / f"{r.router_id}.pid",
                    env={"PYTHONUNBUFFERED": "1"},
                )
            )

    def start(self, *, ready_timeout_s: float = 30.0) -> None:
        etcd = [c for c in self.children if c.kind == "etcd"]
        for c in etcd:
            c.start()
            log.info("started etcd member %s (pid %d, log %s)", c.name, c.proc.pid if c.proc else -1, c.log_path)
        if etcd:
            try:
                self._wait_etcd(etcd, ready_timeout_s)
            except Exception:
                self.stop_all()
                raise
        for kind in ("node", "router"):
            for c in self.children:
                if c.kind == kind:
                    c.start()
                    log.info("started %s %s (pid %d, log %s)", kind, c.name, c.proc.pid if c.proc else -1, c.log_path)

    def _wait_etcd(self, etcd: list[Child], timeout_s: float) -> None:
        """Until the members answer; a member that exits meanwhile fails the start at once, with
        the last line of its log (a port in use, a data dir of another cluster, ...)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for c in etcd:
                if c.proc is not None and c.proc.poll() is not None:
                    last = c.log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                    raise ConfigError(f"etcd member {c.name} exited at start ({c.log_path}): {last[0][:300]}")
            try:
                etcd_members.wait_healthy(list(self.cluster.etcd), timeout_s=1.0)
                return
            except MetaUnavailable:
                if time.monotonic() > deadline:
                    raise

    def wait_ready(
        self,
        reaches: Reaches | None,
        *,
        timeout_s: float,
        progress: Callable[[str], None] | None = None,
        poll_s: float = 0.25,
    ) -> Readiness | None:
        """Until the cluster is ready (see ``fabric.cluster.readiness``), restarting children that
        exit meanwhile; ``progress`` gets what is missing whenever that changes. None when stop()
        was called first. Raises Timeout naming what is still missing after ``timeout_s``."""
        meta = Namespaced(EtcdClient(list(self.cluster.etcd)), self.cluster.name)
        deadline = time.monotonic() + timeout_s
        said = ""
        try:
            while True:
                self.tend(time.monotonic())
                try:
                    state = judge(self.cluster, read_view(meta), reaches)
                except MetaUnavailable as exc:
                    state = Readiness(etcd_error=exc.message)
                if state.ready:
                    return state
                missing = state.missing()
                if time.monotonic() >= deadline:
                    raise Timeout(f"the cluster is not ready after {timeout_s:.0f} s: {missing}{self._exits()}")
                if progress is not None and missing != said:
                    progress(missing)
                    said = missing
                if self._stop.wait(poll_s):
                    return None
        finally:
            meta.close()

    def _exits(self) -> str:
        """Which children exited since the start (with their logs), for an error message."""
        gone = [c for c in self.children if c.restarts or c.proc is None or c.proc.poll() is not None]
        if not gone:
            return f" (logs in {self.root.resolve() / 'logs'})"
        return "; exited since the start: " + ", ".join(f"{c.name} (see {c.log_path.resolve()})" for c in gone)

    def watch(self, poll_s: float = 0.2) -> None:
        """Restart children that exit, until stop() is called."""
        while not self._stop.wait(poll_s):
            self.tend(time.monotonic())

    def tend(self, now: float) -> None:
        """Start again the children whose backoff is over; note the ones that exited."""
        for c in self.children:
            if c.proc is None:
                if now >= c.due:
                    c.start()
                    c.restarts += 1
                    pid = c.proc.pid if c.proc is not None else -1
                    log.warning("restarted %s %s (pid %d, restart %d)", c.kind, c.name, pid, c.restarts)
                continue
            code = c.proc.poll()
            if code is None:
                if now - c.started > STABLE_S:
                    c.backoff = BACKOFF_S[0]
                continue
            c.proc = None
            c.due = now + c.backoff
            log.warning("%s %s exited with status %s; starting it again in %.0f s", c.kind, c.name, code, c.backoff)
            c.backoff = min(c.backoff * 2, BACKOFF_S[1])

    def stop(self) -> None:
        self._stop.set()

    def stop_all(self, stopping: Callable[[str], None] | None = None) -> None:
        """Routers, then nodes, then etcd: SIGTERM, SIGKILL after a grace period; PID files removed.
        ``stopping(what)`` hears each step (a progress line)."""
        for kind in ("router", "node", "etcd"):
            group = [c for c in self.children if c.kind == kind and c.proc is not None]
            if stopping is not None and group:
                stopping(f"{len(group)} {kind}(s): {', '.join(c.name for c in group)}")
            for c in group:
                if c.proc is not None and c.proc.poll() is None:
                    c.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for c in group:
                assert c.proc is not None
                try:
                    c.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("%s %s did not stop in %.0f s: SIGKILL", c.kind, c.name, STOP_GRACE_S)
                    c.proc.kill()
                    c.proc.wait(5)
                c.proc = None
        for c in self.children:
            c.pid_path.unlink(missing_ok=True)


def run(
    config_path: str,
    cluster: ClusterConfig,
    *,
    on_ready: object = None,
    reaches: Reaches | None = None,
    ready_timeout_s: float = 60.0,
    progress: Callable[[str], None] | None = None,
    stopping: Callable[[str], None] | None = None,
) -> None:
    """Start the cluster of ``config_path`` in the foreground until SIGINT or SIGTERM; call
    ``on_ready`` once it is ready (``Supervisor.wait_ready``). Raises Timeout (everything
    stopped) when it is not ready in ``ready_timeout_s``. ``stopping`` hears each step of the stop."""
    sup = Supervisor(config_path, cluster)
    if not cluster.etcd_members:
        log.info("no [[cluster.etcd_members]]: using the etcd at %s", ", ".join(cluster.etcd))

    def _stop(signum: int, frame: object) -> None:
        sup.stop()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        sup.start()
    except ConfigError:
        raise
    try:
        if sup.wait_ready(reaches, timeout_s=ready_timeout_s, progress=progress) is None:
            return  # stopped while waiting
        if callable(on_ready):
            on_ready(sup)
        sup.watch()
    finally:
        sup.stop_all(stopping)
