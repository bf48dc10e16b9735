"""What this machine lets any Python message path reach: the floor under fabric's latency figures.

    python -m tools.latency_floor                 # ~15 s: wake-up cost, then a minimal relay at 5,000 msg/s
    python -m tools.latency_floor --rate 5000 --seconds 10

Two measurements, standard library only, every process on this machine and every byte over
socket pairs (no network):

1. **Wake-up cost.** 100-byte messages, one every 200 us, to a receiver that either sleeps in
   ``poll()`` or polls without sleeping. The difference is what every hop to a sleeping process
   costs here: the sender's ``send`` (it does the wake-up) and the receiver's delay. On a virtual
   machine whose idle vCPUs halt it is tens of microseconds (on the development VM: 46 us p50 against 3 us),
   which is why the node polls for a while before it sleeps (``[node] idle_poll_us``).
2. **A minimal relay.** The shape of the peer harness's latency case in the least Python that can
   do it: a paced producer (one 100-byte message per send, stamped with the monotonic clock), a
   relay that appends each message to a file with ``os.write`` and forwards it, and a consumer
   that, for every read, sends a commit and waits for its reply, as a group member committing
   every poll does. Its percentiles are a floor for any Python queue on this machine; fabric's
   own (``docs/performance.md``) sit above it by what its per-message work costs.

Bounded: a fixed number of messages, each wait with a timeout; the child processes exit with
their sockets.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import struct
import tempfile
import time
from collections.abc import Sequence

from fabric.bench.single import percentiles  # the same percentiles `fabric bench` reports

_STAMP = struct.Struct("<QQ")  # sent at (monotonic ns), sequence number
SIZE = 100  # bytes per message
COMMIT = b"C" * SIZE  # the relay's commit reply: a message no producer sends
WAIT_S = 5.0  # the longest any side waits for the next thing before giving up


def _paced(count: int, rate: float) -> list[float]:
    """Due times (monotonic seconds) of ``count`` messages at ``rate`` per second from now."""
    t0 = time.monotonic() + 0.05
    return [t0 + i / rate for i in range(count)]


def _sleep_until(t: float) -> None:
    d = t - time.monotonic()
    if d > 0:
        time.sleep(d)


def _recv_exact(sock: socket.socket, buf: bytearray, n: int) -> bool:
    """Top ``buf`` up to at least ``n`` bytes; False when the peer is gone or ``WAIT_S`` passed."""
    deadline = time.monotonic() + WAIT_S
    while len(buf) < n:
        if not select.select([sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
            return False
        got = sock.recv(65536)
        if not got:
            return False
        buf += got
    return True


# ---------------------------------------------------------------------- 1. wake-up cost


def wake_cost(count: int = 5_000, gap_s: float = 0.0002) -> dict[str, dict[str, float]]:
    """Send ``count`` messages to a sleeping and then to a polling receiver: per mode, the
    sender's ``send`` time and the delivery delay (percentiles, us)."""
    out = {}
    for mode in ("sleeping", "polling"):
        a, b = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the receiver: report delays back on the same socket, then exit
            a.close()
            code = 1
            try:
                b.setblocking(False)
                delays: list[int] = []
                poller = select.poll()
                poller.register(b.fileno(), select.POLLIN)
                buf = bytearray()
                deadline = time.monotonic() + WAIT_S + count * gap_s * 2
                while len(delays) < count and time.monotonic() < deadline:
                    if mode == "sleeping":
                        poller.poll(100)
                    try:
                        got = b.recv(65536)
                    except BlockingIOError:
                        continue
                    now = time.monotonic_ns()
                    if not got:
                        break
                    buf += got
                    while len(buf) >= SIZE:
                        delays.append(now - _STAMP.unpack_from(buf)[0])
                        del buf[:SIZE]
                b.setblocking(True)
                b.sendall(struct.pack(f"<I{len(delays)}Q", len(delays), *delays))
                code = 0
            finally:
                os._exit(code)
        b.close()
        pad = b"x" * (SIZE - _STAMP.size)
        sends = []
        for i in range(count):
            until = time.perf_counter() + gap_s  # the sender stays busy: only the receiver sleeps
            t = time.perf_counter_ns()
            a.send(_STAMP.pack(time.monotonic_ns(), i) + pad)
            sends.append(time.perf_counter_ns() - t)
            while time.perf_counter() < until:
                pass
        buf = bytearray()
        delivered: list[int] = []
        if _recv_exact(a, buf, 4):
            (n,) = struct.unpack_from("<I", buf)
            if _recv_exact(a, buf, 4 + 8 * n):
                delivered = list(struct.unpack_from(f"<{n}Q", buf, 4))
        a.close()
        os.waitpid(pid, 0)
        out[mode] = {
            "send_us_p50": percentiles(sends)["p50_us"],
            "delivered": float(len(delivered)),
            **{f"delay_{k}": v for k, v in percentiles(delivered).items()},
        }
    return out


# ---------------------------------------------------------------------- 2. the minimal relay


def _relay(prod: socket.socket, cons: socket.socket, path: str) -> None:
    """Append what the producer sends to ``path`` and forward it, whole messages only; answer
    each commit from the consumer with one COMMIT message (after appending it too)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    poller = select.poll()
    poller.register(prod.fileno(), select.POLLIN)
    poller.register(cons.fileno(), select.POLLIN)
    rest = b""
    try:
        while True:
            ready = poller.poll(int(WAIT_S * 1000))
            if not ready:
                return
            for fd_ready, _ in ready:
                if fd_ready == prod.fileno():
                    got = prod.recv(65536)
                    if not got:
                        return
                    rest += got
                    whole = len(rest) // SIZE * SIZE
                    if whole:
                        chunk, rest = rest[:whole], rest[whole:]
                        os.write(fd, chunk)
                        cons.sendall(chunk)
                else:
                    got = cons.recv(65536)
                    if not got:
                        return
                    os.write(fd, got)
                    cons.sendall(COMMIT)
    finally:
        os.close(fd)


def _producer(sock: socket.socket, count: int, rate: float) -> None:
    pad = b"x" * (SIZE - _STAMP.size)
    for i, due in enumerate(_paced(count, rate)):
        _sleep_until(due)
        sock.sendall(_STAMP.pack(time.monotonic_ns(), i) + pad)
    time.sleep(0.2)  # let the last ones through before the relay sees the end


def _consumer(sock: socket.socket, count: int) -> tuple[list[int], int]:
    """As a group member that commits every poll: a poll returns what has arrived (waiting only
    when nothing has), then a commit goes out and its reply is waited for. Messages that arrive
    during the commit are returned by the next poll, and their latency counts until then."""
    buf = bytearray()
    lat: list[int] = []
    arrived: list[int] = []  # stamps read off the socket, not yet returned by a poll
    commits = 0

    def read(wait_for: int) -> bool:
        """Read until ``buf`` holds ``wait_for`` bytes; file messages; True if a COMMIT came."""
        if not _recv_exact(sock, buf, wait_for):
            raise EOFError
        replied = False
        whole = len(buf) // SIZE * SIZE
        for at in range(0, whole, SIZE):
            if buf[at : at + SIZE] == COMMIT:
                replied = True
            else:
                arrived.append(_STAMP.unpack_from(buf, at)[0])
        del buf[:whole]
        return replied

    try:
        while len(lat) < count:
            while not arrived:  # the poll: wait for the next message
                read(SIZE)
            now = time.monotonic_ns()
            lat.extend(now - s for s in arrived)
            arrived.clear()
            sock.sendall(b"commit %d" % len(lat))  # the commit, and its reply waited for
            commits += 1
            while not read(SIZE):
                pass
    except EOFError:
        pass
    return lat, commits


def relay_latency(rate: float = 5_000, seconds: float = 10, warmup: float = 0.05) -> dict[str, float]:
    """The minimal relay at ``rate`` messages per second for ``seconds``: latency percentiles
    (us) past the first ``warmup`` share of messages, and what arrived."""
    count = max(1, int(rate * seconds))
    p_relay, p_prod = socket.socketpair()
    c_relay, c_cons = socket.socketpair()
    with tempfile.TemporaryDirectory(prefix="fabric-floor-") as tmp:
        pids = []
        for role in ("relay", "producer"):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    if role == "relay":
                        p_prod.close()
                        c_cons.close()
                        _relay(p_relay, c_relay, os.path.join(tmp, "log"))
                    else:
                        for s in (p_relay, c_relay, c_cons):
                            s.close()
                        _producer(p_prod, count, rate)
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        p_relay.close()
        c_relay.close()
        p_prod.close()
        lat, commits = _consumer(c_cons, count)
        c_cons.close()
        for pid in pids:
            os.waitpid(pid, 0)
    kept = lat[int(len(lat) * warmup) :]
    return {"sent": float(count), "received": float(len(lat)), "commits": float(commits), **percentiles(kept)}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=5_000, help="the relay's messages per second (default 5000)")
    ap.add_argument("--seconds", type=float, default=10, help="how long the relay runs (default 10)")
    ap.add_argument("--wakes", type=int, default=5_000, help="messages per wake-up measurement (default 5000)")
    args = ap.parse_args(argv)
    for mode, r in wake_cost(args.wakes).items():
        print(
            f"wake-up, receiver {mode:8}: sender's send p50 {r['send_us_p50']:6.1f} us; "
            f"delivered after p50 {r['delay_p50_us']:6.1f} us, p99 {r['delay_p99_us']:7.1f} us"
        )
    r = relay_latency(args.rate, args.seconds)
    print(
        f"minimal relay, {args.rate:,.0f} msg/s x {args.seconds:g} s, commit per read: "
        f"{r['received']:,.0f} of {r['sent']:,.0f} received; latency us "
        + f"p50 {r['p50_us']:,.0f} p90 {r['p90_us']:,.0f} p99 {r['p99_us']:,.0f} p99.9 {r['p999_us']:,.0f}"
    )


if __name__ == "__main__":
    main()
