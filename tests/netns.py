"""Real network partitions for tests: hosts in network namespaces of their own, one bridge.

Theory of operation
-------------------
``Netns`` makes a *hub* namespace holding a bridge and, per ``add_host``, a namespace with a
veth pair: ``eth0`` (address ``10.77.0.<octet>/24``) in the host, its peer ``v-<host>`` on the
hub's bridge. Those addresses exist only inside the namespaces made here: nothing is added to
the machine's own namespace, and no traffic leaves the machine. Processes run inside a host with
``spawn`` / ``run`` (``ip netns exec``), each in a session of its own.

Faults:

- ``cut(host)`` sets the host's link down at the bridge: its packets are dropped, nobody gets a
  reset (a pulled cable, a dead switch port); ``heal(host)`` sets it up again;
- ``isolate(host, keep=[...])`` drops, with nftables rules inside the host, every IP packet to
  or from anyone but ``keep`` (a partial partition: e.g. a store cut off from its peers and etcd
  but still reached by its clients); ``block(host, others)`` drops every IP packet between
  ``host`` and ``others`` only (a client cut off from one router); ``loss(host, percent)`` drops
  that share of its packets at random, each way (on every host: a packet between two hosts
  crosses two such links); ``unfilter(host)`` removes any of them.

``close()`` (also on ``__exit__``) ends every process it started, by process group, and deletes
every namespace it made; a SIGTERM to the test process meanwhile (``timeout``, a CI runner giving
up) is turned into KeyboardInterrupt so that this still happens. Namespaces are named ``fxn-<pid>-...`` after the test process, so a run
that died without cleaning up (SIGKILL) is cleaned by the next one (``sweep_stale``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "fxn-"
SUBNET = "10.77.0"
NFT_TABLE = "fabric_fault"


def unavailable() -> str | None:
    """Why partition tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (apt-get install iproute2 nftables)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"'ip netns add' fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _namespaces() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _kill_group(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """End a process we started and its group: SIGTERM, SIGKILL after a grace period; reaped."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone: anything it left in its group goes too
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def sweep_stale() -> None:
    """Delete namespaces a dead test process of this harness left (and what still runs in them)."""
    for ns in _namespaces():
        if not ns.startswith(PREFIX):
            continue
        try:
            owner = int(ns[len(PREFIX) :].split("-")[0])
        except ValueError:
            continue
        if owner == os.getpid() or Path(f"/proc/{owner}").exists():
            continue
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}: closing the network namespaces")


@dataclass(frozen=True)
class Host:
    name: str
    ns: str
    addr: str
    link: str  # its veth's name on the hub's bridge


class Netns:
    """Hosts on one bridge, each in a namespace of its own; see the module docstring."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.tag = f"{PREFIX}{os.getpid()}-{os.urandom(2).hex()}"
        self.hub = f"{self.tag}-hub"
        self.hosts: dict[str, Host] = {}
        self.env = dict(env if env is not None else os.environ)
        self._made: list[str] = []
        self._procs: list[subprocess.Popen[bytes]] = []  # and piped ones (text)
        self._sigterm: object = None  # the SIGTERM handler to put back on close()

    def __enter__(self) -> Netns:
        sweep_stale()
        if threading.current_thread() is threading.main_thread():
            self._sigterm = signal.signal(signal.SIGTERM, _interrupt)
        try:
            self._add_ns(self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def add_host(self, name: str, octet: int) -> Host:
        host = Host(name, f"{self.tag}-{name}", f"{SUBNET}.{octet}", f"v-{name}")
        self._add_ns(host.ns)
        _ip("-n", self.hub, "link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        _ip("-n", self.hub, "link", "set", host.link, "master", "br0", "up")
        _ip("-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
        _ip("-n", host.ns, "link", "set", "eth0", "up")
        self.hosts[name] = host
        return host

    # -- processes ------------------------------------------------------------------------------

    def _argv(self, host: Host, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", host.ns, *argv]

    def spawn(self, host: Host, argv: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host`` (its own session), output appended to ``log_path``."""
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                self._argv(host, argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self._procs.append(proc)
        return proc

    def spawn_piped(self, host: Host, argv: Sequence[str], log_path: Path) -> subprocess.Popen[str]:
        """Start ``argv`` inside ``host`` with pipes to its stdin and stdout (text, by lines)."""
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                self._argv(host, argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
        self._procs.append(proc)  # type: ignore[arg-type]
        return proc

    def run(self, host: Host, argv: Sequence[str], timeout_s: float = 60) -> str:
        """Run ``argv`` inside ``host`` to its end; its stdout (RuntimeError if it fails)."""
        proc = subprocess.Popen(
            self._argv(host, argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
        )
        self._procs.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            raise RuntimeError(f"{argv} in {host.name}: no end in {timeout_s} s: {err.decode()[-2000:]}") from None
        finally:
            self._procs.remove(proc)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv} in {host.name} exited {proc.returncode}: {err.decode()[-2000:]}")
        return out.decode()

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """End one process this harness started (its whole group)."""
        _kill_group(proc)

    # -- faults ---------------------------------------------------------------------------------

    def cut(self, host: Host) -> None:
        _ip("-n", self.hub, "link", "set", host.link, "down")

    def heal(self, host: Host) -> None:
        _ip("-n", self.hub, "link", "set", host.link, "up")

    def _nft(self, host: Host, rules: str) -> None:
        r = subprocess.run(
            ["ip", "netns", "exec", host.ns, "nft", "-f", "-"], input=rules, capture_output=True, text=True
        )
        if r.returncode != 0:
            raise RuntimeError(f"nft in {host.name}: {r.stderr.strip()}\n{rules}")

    def _filter(self, host: Host, rule: str) -> None:
        self.unfilter(host)
        self._nft(
            host,
            f"table ip {NFT_TABLE} {{\n"
            f'  chain input {{ type filter hook input priority 0; policy accept; iifname "lo" accept; {rule} }}\n'
            f'  chain output {{ type filter hook output priority 0; policy accept; oifname "lo" accept; {rule} }}\n'
            "}\n",
        )

    def isolate(self, host: Host, keep: Sequence[Host] = ()) -> None:
        """Drop every IP packet between ``host`` and anyone but ``keep``."""
        if keep:
            allowed = ", ".join(h.addr for h in keep)
            self._filter(host, f"ip saddr {{ {allowed} }} accept; ip daddr {{ {allowed} }} accept; drop;")
        else:
            self._filter(host, "drop;")

    def block(self, host: Host, others: Sequence[Host]) -> None:
        """Drop every IP packet between ``host`` and ``others`` (and nobody else)."""
        addrs = ", ".join(h.addr for h in others)
        self._filter(host, f"ip saddr {{ {addrs} }} drop; ip daddr {{ {addrs} }} drop;")

    def loss(self, host: Host, percent: int) -> None:
        """Drop ``percent`` % of ``host``'s IP packets, each way, at random."""
        self._filter(host, f"numgen random mod 100 < {percent} drop;")

    def unfilter(self, host: Host) -> None:
        subprocess.run(["ip", "netns", "exec", host.ns, "nft", "delete", "table", "ip", NFT_TABLE], capture_output=True)

    # -- cleanup --------------------------------------------------------------------------------

    def close(self) -> None:
        """End every process started here, then delete every namespace made here."""
        for proc in self._procs:
            _kill_group(proc)
        self._procs.clear()
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)  # type: ignore[arg-type]
            self._sigterm = None
