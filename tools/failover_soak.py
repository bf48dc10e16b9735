"""Failover soak: a supervised cluster under continuous ``acks=all`` load, its leaders killed.

Runs ``fabric up --config CONFIG`` (default configs/cluster-3.toml: 3 etcd members, 3 stores,
2 routers, all on 127.0.0.1) in a scratch directory, gives a producer only the routers, and kills
with ``kill -9`` the store leading a partition, ``--kills`` times, then the controller's store
``--controller-kills`` times (the supervisor restarts each), then stops a leader's store with
SIGSTOP for ``--pause-s`` seconds ``--pauses`` times. After each fault it reports:

* ``pause``: the longest time any partition went without an acknowledgement after the fault;
* ``isr``: how long until the store was back in the ISR of every partition it holds (from the
  kill, or from the SIGCONT).

At the end: acknowledged messages missing from the log, duplicates and reorderings per
partition (read back through the routers). Bounded: every wait has a deadline, the load stops
by itself, and the cluster is stopped (SIGTERM to the supervisor it started) on every exit.

    python -m tools.failover_soak --kills 20 --controller-kills 1 --pauses 2 --seed 7
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabric.client import Admin, Consumer, Producer
from fabric.cluster.status import read_status

QUEUE = "soak"
PARTITIONS = 3


def _status(cfg: dict[str, Any]) -> dict[str, Any]:
    c = cfg["cluster"]
    return read_status(c["etcd"], c["name"], [n["id"] for n in c["nodes"]], [r["id"] for r in c["routers"]])


def _wait(what: str, ok: Callable[[], bool], timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if ok():
                return time.monotonic() - start
        except Exception:  # etcd or a node busy: look again
            pass
        time.sleep(0.05)
    raise SystemExit(f"soak: {what} did not happen within {timeout_s} s")


class Load:
    """A producer through the routers, one message to every partition every few ms."""

    def __init__(self, routers: str) -> None:
        self.prod = Producer(routers, acks="all", linger_ms=2)
        self.acked: dict[int, list[tuple[float, int]]] = {p: [] for p in range(PARTITIONS)}
        self.errors: list[BaseException] = []
        self.sent = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._halt.is_set():
            for p in range(PARTITIONS):
                self.prod.send(QUEUE, b"%d" % i, partition=p, callback=self._done(p, i))
                i += 1
            self.sent = i
            time.sleep(0.004)

    def _done(self, p: int, i: int) -> Callable[[Any, BaseException | None], None]:
        def cb(md: Any, exc: BaseException | None) -> None:
            if exc is None:
                self.acked[p].append((time.monotonic(), i))
            else:
                self.errors.append(exc)

        return cb

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(30)
        self.prod.flush(120)
        self.prod.close()

    def pause_after(self, t0: float, until: float) -> float:
        worst = 0.0
        for times in self.acked.values():
            stamps = [t0, *[t for t, _ in list(times) if t0 < t <= until], until]
            worst = max(worst, *(b - a for a, b in itertools.pairwise(stamps)))
        return worst


def _settled(cfg: dict[str, Any]) -> bool:
    s = _status(cfg)
    led = sum(1 for p in s["partitions"] if p["queue"] == QUEUE and p["leader"])
    return led == PARTITIONS and all(n["live"] for n in s["nodes"]) and bool(s["controller"])


def _epoch(cfg: dict[str, Any], node: str) -> int | None:
    """The node's registration epoch (a new one each time it starts), None while unregistered."""
    return next((n["epoch"] for n in _status(cfg)["nodes"] if n["name"] == node and n["live"]), None)


def _pid(root: Path, name: str) -> int:
    return int((root / "fabric-cluster" / "pids" / f"{name}.pid").read_text())


def _fault_and_measure(cfg: dict[str, Any], root: Path, load: Load, victim: str, pause_s: float) -> dict[str, Any]:
    """kill -9 ``victim`` (``pause_s`` 0), or SIGSTOP it for ``pause_s`` seconds; the longest pause
    in acknowledgements after it, and when the store was back in every ISR (after a kill: the
    restarted process; after a pause: the same process, registered again since it was fenced)."""
    old = _pid(root, victim)
    held = [(p["queue"], p["partition"]) for p in _status(cfg)["partitions"] if victim in p["replicas"]]
    before = _epoch(cfg, victim)
    t0 = time.monotonic()
    if pause_s:
        os.kill(old, signal.SIGSTOP)
        try:
            time.sleep(pause_s)
        finally:
            os.kill(old, signal.SIGCONT)
    else:
        os.kill(old, signal.SIGKILL)

    def back_in_isr() -> bool:
        epoch = _epoch(cfg, victim)
        if epoch is None or epoch == before:  # not restarted yet (or its old registration not lapsed)
            return False
        parts = {(p["queue"], p["partition"]): p for p in _status(cfg)["partitions"]}
        return all(victim in parts[k]["isr"] for k in held if k in parts)

    isr_s = _wait(f"{victim} back in every ISR", back_in_isr, 120)
    time.sleep(max(0.0, 3.5 + pause_s - (time.monotonic() - t0)))  # let the pause window close
    return {"victim": victim, "pause_s": round(load.pause_after(t0, time.monotonic()), 3), "isr_s": round(isr_s, 2)}


def _verify(routers: str, load: Load) -> dict[str, int]:
    acked = {p: [i for _, i in v] for p, v in load.acked.items()}
    seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    want = sum(len(v) for v in acked.values())
    with Consumer(QUEUE, routers, start="earliest") as cons:
        deadline = time.monotonic() + 120
        got = 0
        while time.monotonic() < deadline and got < load.sent:
            b = cons.poll_batch(2000)
            if b is None:
                break
            seen[b.partition].extend(int(v) for v in b.values)
            got += len(b.values)
    lost = sum(len(set(acked[p]) - set(seen[p])) for p in acked)
    dups = sum(len(v) - len(set(v)) for v in seen.values())
    reordered = sum(1 for v in seen.values() for a, b in itertools.pairwise(v) if b < a)
    return {
        "acknowledged": want,
        "read": sum(len(v) for v in seen.values()),
        "lost": lost,
        "duplicates": dups,
        "reordered": reordered,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "configs" / "cluster-3.toml"))
    ap.add_argument("--kills", type=int, default=20, help="leader kills (kill -9), one after another")
    ap.add_argument("--controller-kills", type=int, default=1, help="kills of the controller's store after those")
    ap.add_argument("--pauses", type=int, default=0, help="then SIGSTOP a leader's store this many times")
    ap.add_argument("--pause-s", type=float, default=10.0, help="how long each SIGSTOP lasts")
    ap.add_argument("--seed", type=int, default=None, help="which partition's leader each kill picks")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    config = Path(args.config).resolve()
    cfg = tomllib.loads(config.read_text())
    routers = ",".join(r["listen"] for r in cfg["cluster"]["routers"])
    root = Path(tempfile.mkdtemp(prefix="fabric-soak-"))
    print(f"soak: seed {seed}, cluster in {root}", file=sys.stderr)
    sup = subprocess.Popen(
        [sys.executable, "-m", "fabric.cli", "up", "--config", str(config)],
        cwd=root,
        stdout=open(root / "up.log", "wb"),  # noqa: SIM115 - lives as long as the cluster
        stderr=subprocess.STDOUT,
    )
    results: list[dict[str, Any]] = []
    try:
        n_nodes = len(cfg["cluster"]["nodes"])

        def up() -> bool:
            s = _status(cfg)
            return sum(n["live"] for n in s["nodes"]) == n_nodes and bool(s["controller"])

        _wait("the cluster coming up", up, 90)
        with Admin(routers, timeout_ms=20_000) as admin:
            admin.create_queue(QUEUE, partitions=PARTITIONS)
        _wait(
            "every partition led",
            lambda: sum(1 for p in _status(cfg)["partitions"] if p["queue"] == QUEUE and p["leader"]) == PARTITIONS,
            30,
        )
        load = Load(routers)
        load.start()
        time.sleep(2)
        for k in range(args.kills + args.controller_kills + args.pauses):
            _wait("every partition led and every store live", lambda: _settled(cfg), 60)
            st = _status(cfg)
            pause_s = 0.0
            if k < args.kills or k >= args.kills + args.controller_kills:
                pick = rng.randrange(PARTITIONS)
                victim = next(p["leader"] for p in st["partitions"] if p["queue"] == QUEUE and p["partition"] == pick)
                kind = "leader"
                if k >= args.kills + args.controller_kills:
                    kind, pause_s = "paused leader", args.pause_s
            else:
                victim = st["controller"]["name"]
                kind = "controller"
            r = {"kill": k + 1, "kind": kind, **_fault_and_measure(cfg, root, load, victim, pause_s)}
            results.append(r)
            print(
                f"soak: kill {r['kill']} ({kind} {victim}): pause {r['pause_s']} s, back in ISR {r['isr_s']} s",
                file=sys.stderr,
            )
        load.stop()
        summary = {
            "seed": seed,
            "kills": results,
            "errors": [repr(e) for e in load.errors[:5]],
            **_verify(routers, load),
        }
    finally:
        sup.send_signal(signal.SIGTERM)
        try:
            sup.wait(60)
        except subprocess.TimeoutExpired:
            sup.kill()
    pauses = [r["pause_s"] for r in results]
    isr = [r["isr_s"] for r in results]
    summary["pause_max_s"] = max(pauses, default=0.0)
    summary["isr_max_s"] = max(isr, default=0.0)
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"soak: {len(results)} kills, longest pause {summary['pause_max_s']} s, slowest back in ISR "
            f"{summary['isr_max_s']} s; acknowledged {summary['acknowledged']}, lost {summary['lost']}, "
            f"duplicates {summary['duplicates']}, reordered {summary['reordered']}, errors {len(load.errors)}"
        )
    ok = not summary["lost"] and not summary["duplicates"] and not summary["reordered"] and not load.errors
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
