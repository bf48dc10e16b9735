"""Run real etcd 3.4 members as child processes: the command line, start, health, stop.

Theory of operation
-------------------
A member is described by an ``EtcdMemberSpec`` (name, data dir, client URL, peer URL); the
cluster is the list of every member's spec. ``argv`` builds the etcd command line: the static
bootstrap (``--initial-cluster`` of every member, a shared ``--initial-cluster-token``,
``--initial-cluster-state new`` the first time, ``existing`` to rejoin), loopback-friendly raft
timings (100 ms heartbeat, 1000 ms election) and watch progress notifications every few seconds
(so a client can tell a silent watch from a stopped member). etcd ignores the bootstrap flags
once its data dir holds a member, so a restart with the same data dir simply rejoins.

``start`` runs one member with its output appended to a log file, in a session of its own (a
Ctrl-C at the terminal reaches the supervisor, which stops members in its own order).
``wait_healthy`` polls each member's ``/health`` until every one reports a leader.
``stop`` ends a member we started, by its PID: SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fabric.cluster.etcd import parse_endpoint
from fabric.cluster.meta import MetaUnavailable
from fabric.errors import ConfigError

__all__ = ["EtcdMemberSpec", "argv", "etcd_binary", "start", "stop", "wait_healthy"]

INSTALL_HINT = "apt-get install etcd-server etcd-client"
HEARTBEAT_MS = 100
ELECTION_MS = 1000
MAX_TXN_OPS = 8192  # one queue of up to 4096 partitions (x2 with priority levels) is one txn
COMPACTION_RETENTION = 100_000  # revisions kept for watches that fall behind
PROGRESS_NOTIFY = "5s"


@dataclass(frozen=True, slots=True)
class EtcdMemberSpec:
    name: str
    data_dir: str
    client_url: str  # http://host:port clients use
    peer_url: str  # http://host:port the other members use


def etcd_binary() -> str:
    """Path of the etcd executable; ConfigError with the install command when there is none."""
    path = shutil.which("etcd")
    if path is None:
        raise ConfigError(f"etcd is not installed (no 'etcd' on PATH): {INSTALL_HINT}")
    return path


def _url(field: str, url: str) -> str:
    try:
        host, port = parse_endpoint(url)
    except ConfigError as e:
        raise ConfigError(f"{field}: {e}") from None
    return f"http://{host}:{port}"


def argv(spec: EtcdMemberSpec, cluster: Sequence[EtcdMemberSpec], *, new: bool, token: str = "fabric") -> list[str]:
    """The etcd 3.4 command line for ``spec`` in ``cluster`` (``new``: bootstrap a new cluster)."""
    names = [m.name for m in cluster]
    if spec.name not in names:
        raise ConfigError(f"etcd member {spec.name!r} is not in the cluster {names}")
    if len(set(names)) != len(names):
        raise ConfigError(f"etcd member names repeat: {names}")
    client, peer = _url(f"{spec.name}.client_url", spec.client_url), _url(f"{spec.name}.peer_url", spec.peer_url)
    initial = ",".join(f"{m.name}={_url(f'{m.name}.peer_url', m.peer_url)}" for m in cluster)
    return [
        etcd_binary(),
        "--name", spec.name,
        "--data-dir", spec.data_dir,
        "--listen-client-urls", client,
        "--advertise-client-urls", client,
        "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer,
        "--initial-cluster", initial,
        "--initial-cluster-state", "new" if new else "existing",
        "--initial-cluster-token", token,
        "--heartbeat-interval", str(HEARTBEAT_MS),
        "--election-timeout", str(ELECTION_MS),
        "--experimental-watch-progress-notify-interval", PROGRESS_NOTIFY,
        "--max-txn-ops", str(MAX_TXN_OPS),  # a queue's partitions are created in one transaction
        "--auto-compaction-mode", "revision",  # keep the last revisions only: the history stays small
        "--auto-compaction-retention", str(COMPACTION_RETENTION),
        "--logger", "zap",
        "--log-outputs", "stderr",
    ]  # fmt: skip


def start(
    spec: EtcdMemberSpec,
    cluster: Sequence[EtcdMemberSpec],
    log_path: str | os.PathLike[str],
    *,
    new: bool | None = None,
) -> subprocess.Popen[bytes]:
    """Start one member; ``new`` defaults to "its data dir holds no member yet"."""
    if new is None:
        new = not (Path(spec.data_dir) / "member").is_dir()
    cmd = argv(spec, cluster, new=new)
    Path(spec.data_dir).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _health(endpoint: str, timeout_s: float) -> str | None:
    """None when the member says it is healthy, else why not."""
    host, port = parse_endpoint(endpoint)
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        body = resp.read()
        answer = json.loads(body) if body else {}
        if resp.status == 200 and str(answer.get("health")) == "true":
            return None
        return f"HTTP {resp.status} {body[:200]!r}"
    except (OSError, http.client.HTTPException, ValueError) as e:
        return str(e) or type(e).__name__
    finally:
        conn.close()


def wait_healthy(endpoints: Sequence[str], timeout_s: float) -> None:
    """Return once every member in ``endpoints`` reports healthy; MetaUnavailable after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pending = {e: "not asked yet" for e in endpoints}
    while True:
        for e in list(pending):
            why = _health(e, min(1.0, max(0.05, deadline - time.monotonic())))
            if why is None:
                del pending[e]
            else:
                pending[e] = why
        if not pending:
            return
        if time.monotonic() >= deadline:
            detail = "; ".join(f"{e} ({why})" for e, why in pending.items())
            raise MetaUnavailable(f"etcd members not healthy after {timeout_s} s: {detail}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> int | None:
    """Stop a member we started, by PID: SIGTERM, SIGKILL after ``timeout_s``; its exit status."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout_s)
    return proc.returncode
