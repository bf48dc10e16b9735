"""``EtcdClient``: the ``MetaStore`` over etcd 3.4's v3 JSON gateway, rotating across members.

Theory of operation
-------------------
Every call is one HTTP POST of a JSON body to ``/v3/...`` on one member (keys and values are
base64, int64s come back as strings, fields equal to zero are left out). The client keeps one
persistent HTTP/1.1 connection per member, each behind its own lock, and a ``MemberHealth``
(fabric/cluster/etcd_health.py): members that failed lately are *suspect* and asked last, the
member that answered last is asked first. A call walks the members in that order, within
``timeout_s`` in all:

- a member that cannot be reached (no connection within ``connect_timeout_s``, a refused
  connect, a kept-alive connection the member has closed, its connection busy with another
  thread's call) is skipped: nothing was sent, so trying the next one is always safe;
- a member that refuses with "no leader" (it is cut off from the quorum) is skipped too:
  etcd refuses that before proposing anything;
- a member that took the request but failed it (no answer, dropped connection, etcd's "request
  timed out") is skipped, *except* for a transaction that writes: it may have been applied, so
  the call raises ``MetaUnavailable`` saying the outcome is unknown (re-read, then decide)
  instead of applying it a second time elsewhere;
- a call that is safe to repeat (reads, lease keep-alives, grants and revokes, plain puts and
  deletes) waits at most ``attempt_timeout_s`` for one member's answer, a small fraction of a
  lease's TTL: a member cut off silently (packets dropped, no reset) costs one such wait, then
  it is suspect and the others are asked first. When every member was merely slow, the first of
  them is asked once more with what is left of ``timeout_s``. A writing transaction waits up to
  ``timeout_s`` for its member (it cannot move on anyway);
- when every member failed, ``MetaUnavailable`` names each endpoint and why.

Each request carries the gRPC metadata ``hasleader: true`` (header ``Grpc-Metadata-hasleader``):
a member cut off from the quorum then refuses at once instead of holding the request until the
timeout, and closes watches it can no longer serve.

A watch has a connection of its own: ``watch()`` opens the stream (``/v3/watch``, one
``create_request``), waits for etcd's "created" answer, and hands the stream to a daemon thread
that turns each JSON line into a list of ``WatchEvent`` on a queue. ``poll()`` drains the queue;
a compacted start revision surfaces as ``WatchCompacted``, a stream that ends, breaks, or is
cancelled by etcd as ``MetaUnavailable``; after either the watch is dead: re-read and watch
again. With ``watch_idle_s`` set, the watch also asks etcd for progress notifications and
declares the stream dead after that long without a line (a member that is stopped, not killed);
members started by ``fabric.cluster.etcd_members`` send one every few seconds. A watch is opened on
the first member in the health order, and when a call finds that member failing, the watch on it
is ended too (``MetaUnavailable``): a watch on a member cut off silently would otherwise just
stay quiet, and its owner re-reads and watches again on a healthy member.
"""

from __future__ import annotations

import base64
import http.client
import json
import queue
import select
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fabric.cluster.etcd_health import MemberHealth
from fabric.cluster.meta import (
    Compare,
    Delete,
    Get,
    KeyValue,
    LeaseNotFound,
    MetaUnavailable,
    Put,
    TxnOp,
    TxnResult,
    WatchCompacted,
    WatchEvent,
)
from fabric.errors import ConfigError, FabricError

__all__ = ["EtcdClient", "EtcdWatch", "parse_endpoint", "prefix_end"]

_HEADERS = {"Content-Type": "application/json", "Grpc-Metadata-hasleader": "true"}
_OPS = {"==": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}
_TARGETS = {"value": "VALUE", "create_revision": "CREATE", "mod_revision": "MOD", "version": "VERSION"}
# gRPC status codes etcd puts in its error bodies
_GRPC_DEADLINE, _GRPC_NOT_FOUND, _GRPC_OUT_OF_RANGE, _GRPC_UNAVAILABLE = 4, 5, 11, 14
_MEMBER_FAULTS = (_GRPC_DEADLINE, _GRPC_UNAVAILABLE)
_NO_LEADER = "no leader"  # etcd's refusal under hasleader, before anything is proposed


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``"http://127.0.0.1:2379"`` or ``"127.0.0.1:2379"`` -> ``("127.0.0.1", 2379)``."""
    url = endpoint if "://" in endpoint else "http://" + endpoint
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ConfigError(f"etcd endpoint {endpoint!r}: expected http://host:port or host:port")
    return parts.hostname, port


def prefix_end(prefix: str) -> bytes:
    """etcd's range_end for "every key starting with ``prefix``"."""
    key = bytearray(prefix.encode())
    while key:
        if key[-1] < 0xFF:
            key[-1] += 1
            return bytes(key)
        key.pop()
    return b"\0"  # empty prefix (or all 0xff): every key


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _kv(d: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(d["key"]).decode(),
        value=_unb64(d.get("value", "")),
        create_revision=int(d.get("create_revision", 0)),
        mod_revision=int(d.get("mod_revision", 0)),
        version=int(d.get("version", 0)),
        lease=int(d.get("lease", 0)),
    )


def _range(key: str, prefix: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key)}
    if prefix:
        body["range_end"] = _b64(prefix_end(key))
    return body


def _compare(c: Compare) -> dict[str, Any]:
    if c.target not in _TARGETS or c.op not in _OPS:
        raise ValueError(f"bad compare {c!r}")
    if (c.target == "value") != isinstance(c.value, bytes):
        raise ValueError(f"compare on {c.target} of {c.key!r} needs {'bytes' if c.target == 'value' else 'an int'}")
    value = _b64(c.value) if isinstance(c.value, bytes) else str(c.value)
    return {"key": _b64(c.key), "target": _TARGETS[c.target], "result": _OPS[c.op], c.target: value}


def _op(op: TxnOp) -> dict[str, Any]:
    if isinstance(op, Put):
        return {"request_put": {"key": _b64(op.key), "value": _b64(op.value), "lease": str(op.lease)}}
    if isinstance(op, Delete):
        return {"request_delete_range": _range(op.key, op.prefix)}
    if isinstance(op, Get):
        return {"request_range": _range(op.key, op.prefix)}
    raise TypeError(f"not a txn op: {op!r}")


class _Unreached(Exception):
    """Nothing was sent to the member: trying another is safe."""


class _Busy(_Unreached):
    """The member's connection is held by another thread's call: ask the next member."""


class _Failed(Exception):
    """The member took the request and failed it: it may or may not have been applied."""

    def __init__(self, message: str, *, slow: bool = False) -> None:
        super().__init__(message)
        self.slow = slow  # no answer in time (the member may only be busy), not a refusal


@dataclass
class _Member:
    url: str
    host: str
    port: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    conn: http.client.HTTPConnection | None = None

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Has the member closed (or written to) this idle kept-alive connection?"""
    if conn.sock is None:
        return True
    poller = select.poll()
    poller.register(conn.sock, select.POLLIN)
    return bool(poller.poll(0))  # readable while idle: closed (EOF), reset, or out of step


def _connect(m: _Member, timeout_s: float) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(m.host, m.port, timeout=timeout_s)
    try:
        conn.connect()
    except OSError as e:
        conn.close()
        if isinstance(e, TimeoutError):
            raise _Unreached(f"no connection within {timeout_s:g} s") from e
        raise _Unreached(str(e) or type(e).__name__) from e
    return conn


class EtcdClient:
    """A ``MetaStore`` on etcd members reached through their v3 JSON gateway (thread-safe)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout_s: float = 2.0,
        attempt_timeout_s: float = 0.3,
        connect_timeout_s: float = 0.2,
        watch_idle_s: float | None = None,
    ) -> None:
        if isinstance(endpoints, str) or not endpoints:
            raise ConfigError("etcd endpoints: need a non-empty list of http://host:port")
        self._members = [_Member(f"http://{h}:{p}", h, p) for h, p in map(parse_endpoint, endpoints)]
        self.endpoints: tuple[str, ...] = tuple(m.url for m in self._members)
        self.timeout_s = timeout_s
        self.attempt_timeout_s = min(attempt_timeout_s, timeout_s)
        self.connect_timeout_s = min(connect_timeout_s, timeout_s)
        self.watch_idle_s = watch_idle_s
        self.health = MemberHealth(len(self._members))
        self._clock = time.monotonic
        self._watches: list[EtcdWatch] = []
        self._lock = threading.Lock()  # guards health and _watches

    # -- MetaStore --------------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        kvs = self._call("/v3/kv/range", _range(key, False)).get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        r = self._call("/v3/kv/range", _range(prefix, True))
        return [_kv(d) for d in r.get("kvs", [])], int(r["header"].get("revision", 0))

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        r = self._call("/v3/kv/put", {"key": _b64(key), "value": _b64(value), "lease": str(lease)})
        return int(r["header"]["revision"])

    def delete(self, key: str, prefix: bool = False) -> int:
        return int(self._call("/v3/kv/deleterange", _range(key, prefix)).get("deleted", 0))

    def txn(self, compare: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()) -> TxnResult:
        body = {
            "compare": [_compare(c) for c in compare],
            "success": [_op(o) for o in success],
            "failure": [_op(o) for o in failure],
        }
        writes = any(not isinstance(o, Get) for o in (*success, *failure))
        r = self._call("/v3/kv/txn", body, retry_failed=not writes)
        responses: list[list[KeyValue]] = []
        for resp in r.get("responses", []):
            found = resp.get("response_range")
            responses.append([_kv(d) for d in found.get("kvs", [])] if found is not None else [])
        return TxnResult(bool(r.get("succeeded", False)), int(r["header"]["revision"]), responses)

    def lease_grant(self, ttl_s: int) -> int:
        # a grant repeated on another member only leaves an unused lease behind, to lapse
        return int(self._call("/v3/lease/grant", {"TTL": str(ttl_s)})["ID"])

    def lease_keepalive(self, lease: int) -> int:
        r = self._call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(r.get("result", {}).get("TTL", 0))

    def lease_revoke(self, lease: int) -> None:
        try:
            self._call("/v3/lease/revoke", {"ID": str(lease)})
        except LeaseNotFound:
            pass  # lapsed or revoked already: the keys are gone either way

    def watch(self, prefix: str, start_revision: int) -> EtcdWatch:
        w = EtcdWatch(self, prefix, start_revision)
        with self._lock:
            self._watches = [x for x in self._watches if x.alive] + [w]
        return w

    def close(self) -> None:
        with self._lock:
            watches, self._watches = self._watches, []
        for w in watches:
            w.cancel()
        for m in self._members:
            with m.lock:
                m.drop()

    # -- beyond MetaStore -------------------------------------------------------------------

    def compact(self, revision: int, *, physical: bool = True) -> None:
        """Drop history before ``revision`` (watches from older revisions get WatchCompacted)."""
        self._call("/v3/kv/compaction", {"revision": str(revision), "physical": physical})

    # -- the wire -----------------------------------------------------------------------------

    def _order(self) -> list[int]:
        with self._lock:
            return self.health.order(self._clock())

    def _answered(self, idx: int) -> None:
        with self._lock:
            self.health.answered(idx)

    def _failed(self, idx: int, why: str) -> None:
        """Member ``idx`` failed a call: suspect it, and end the watches that sit on it."""
        with self._lock:
            self.health.failed(idx, self._clock())
            on_it = [w for w in self._watches if w.member == idx and w.alive]
        for w in on_it:
            w.abandon(f"{self._members[idx].url} failed a call ({why})")

    def _call(self, path: str, body: dict[str, Any], *, retry_failed: bool = True) -> dict[str, Any]:
        """POST ``body`` to the members in health order; the decoded JSON answer. See the module
        docstring for which failures move on to the next member."""
        payload = json.dumps(body).encode()
        tried: list[str] = []
        slow: list[int] = []
        deadline = self._clock() + self.timeout_s
        for idx in self._order():
            m = self._members[idx]
            left = deadline - self._clock()
            if left <= 0:
                tried.append(f"{m.url} (not asked: {self.timeout_s:g} s spent)")
                continue
            wait = min(left, self.attempt_timeout_s) if retry_failed else left
            try:
                answer = self._post(m, path, payload, wait)
            except _Unreached as e:
                tried.append(f"{m.url} ({e})")
                if not isinstance(e, _Busy):
                    self._failed(idx, str(e))
                continue
            except _Failed as e:
                tried.append(f"{m.url} ({e})")
                self._failed(idx, str(e))
                if e.slow:
                    slow.append(idx)
                if retry_failed or str(e).endswith(_NO_LEADER):
                    continue
                raise MetaUnavailable(f"etcd {path} outcome unknown: {m.url} failed after taking it ({e})") from e
            self._answered(idx)
            return answer
        left = deadline - self._clock()
        if retry_failed and slow and left > self.attempt_timeout_s:  # every member busy: one longer try
            m = self._members[slow[0]]
            try:
                answer = self._post(m, path, payload, left)
            except (_Unreached, _Failed) as e:
                tried.append(f"{m.url} again ({e})")
            else:
                self._answered(slow[0])
                return answer
        raise MetaUnavailable(f"no etcd member answered {path}: " + "; ".join(tried))

    def _post(self, m: _Member, path: str, payload: bytes, wait_s: float) -> dict[str, Any]:
        """One attempt on member ``m``: at most ``wait_s`` for the connection and the answer."""
        if not m.lock.acquire(timeout=min(wait_s, self.connect_timeout_s)):
            raise _Busy("its connection is busy with another call")
        try:
            if m.conn is not None and _dropped(m.conn):
                m.drop()
            if m.conn is None:
                m.conn = _connect(m, min(wait_s, self.connect_timeout_s))
            if m.conn.sock is not None:
                m.conn.sock.settimeout(wait_s)
            try:
                m.conn.request("POST", path, payload, _HEADERS)
                resp = m.conn.getresponse()
                status, data = resp.status, resp.read()
            except (OSError, http.client.HTTPException) as e:
                m.drop()
                if isinstance(e, TimeoutError):
                    raise _Failed(f"no answer within {wait_s:.3g} s", slow=True) from e
                raise _Failed(str(e) or type(e).__name__) from e
            if resp.will_close:
                m.drop()
        finally:
            m.lock.release()
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise _Failed(f"HTTP {status}: {data[:200]!r}")
        if status == 200 and "error" not in answer:
            return answer
        return _error(m, path, status, answer)


def _error(m: _Member, path: str, status: int, answer: dict[str, Any]) -> dict[str, Any]:
    code = int(answer.get("code", -1))
    message = str(answer.get("message") or answer.get("error") or f"HTTP {status}")
    if code in _MEMBER_FAULTS or (code == -1 and status >= 500):
        raise _Failed(message)
    if code == _GRPC_NOT_FOUND and "lease" in message:
        raise LeaseNotFound(f"etcd {path}: {message}")
    if code == _GRPC_OUT_OF_RANGE and "compacted" in message:
        raise WatchCompacted(f"etcd {path}: {message}")
    raise FabricError(f"etcd at {m.url} refused {path}: {message} (gRPC code {code})")


class EtcdWatch:
    """One etcd watch stream, read by a daemon thread; see the module docstring."""

    def __init__(self, client: EtcdClient, prefix: str, start_revision: int) -> None:
        self.prefix = prefix
        self._events: queue.Queue[list[WatchEvent] | MetaUnavailable] = queue.Queue()
        self._cancelled = threading.Event()
        self._dead: MetaUnavailable | None = None
        self._idle_s = client.watch_idle_s
        create: dict[str, Any] = {**_range(prefix, True), "start_revision": str(start_revision)}
        if self._idle_s is not None:
            create["progress_notify"] = True
        self.member = -1  # index of the member the stream is on
        self._conn, self._resp = self._open(client, json.dumps({"create_request": create}).encode())
        self._thread = threading.Thread(target=self._read, name=f"etcd-watch {prefix}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def poll(self, timeout_s: float) -> list[WatchEvent]:
        if self._dead is not None:
            raise self._dead
        out: list[WatchEvent] = []
        try:
            item = self._events.get(timeout=timeout_s) if timeout_s > 0 else self._events.get_nowait()
            while True:
                if isinstance(item, MetaUnavailable):
                    self._dead = item
                    if out:  # hand over what came before the break; raise on the next poll
                        return out
                    raise item
                out.extend(item)
                item = self._events.get_nowait()
        except queue.Empty:
            return out

    def cancel(self) -> None:
        self._cancelled.set()
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._conn.close()
        if self._dead is None:
            self._dead = MetaUnavailable(f"watch on {self.prefix!r} was cancelled")

    def abandon(self, reason: str) -> None:
        """End the watch from outside its thread (its member failed a call): the next ``poll``
        raises ``MetaUnavailable(reason)`` after what came before."""
        if self._cancelled.is_set():
            return
        self._events.put(MetaUnavailable(f"etcd watch on {self.prefix!r} ended: {reason}"))
        self._cancelled.set()
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _open(self, client: EtcdClient, payload: bytes) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Open the stream on the first member that answers with "created"."""
        tried: list[str] = []
        for idx in client._order():
            m = client._members[idx]
            conn: http.client.HTTPConnection | None = None
            try:
                conn = _connect(m, client.connect_timeout_s)
                if conn.sock is not None:
                    conn.sock.settimeout(client.attempt_timeout_s)
                conn.request("POST", "/v3/watch", payload, _HEADERS)
                resp = conn.getresponse()
                first = _line(resp.readline())
                if resp.status != 200 or not first.get("result", {}).get("created"):
                    raise _Failed(f"HTTP {resp.status}: {first}")
                if conn.sock is not None:
                    conn.sock.settimeout(self._idle_s)
                self.member = idx
                client._answered(idx)
                return conn, resp
            except (_Unreached, _Failed, OSError, http.client.HTTPException, ValueError) as e:
                if conn is not None:
                    conn.close()
                why = str(e) or type(e).__name__
                tried.append(f"{m.url} ({why})")
                client._failed(idx, why)
        raise MetaUnavailable(f"no etcd member opened a watch on {self.prefix!r}: " + "; ".join(tried))

    def _read(self) -> None:
        try:
            while not self._cancelled.is_set():
                raw = self._resp.readline()
                if not raw:
                    raise MetaUnavailable(f"etcd watch stream on {self.prefix!r} ended")
                msg = _line(raw)
                if "error" in msg:
                    raise MetaUnavailable(f"etcd watch on {self.prefix!r} failed: {msg['error']}")
                result = msg.get("result", {})
                if int(result.get("compact_revision", 0)) > 0:
                    raise WatchCompacted(
                        f"etcd watch on {self.prefix!r}: history before revision "
                        f"{result['compact_revision']} is compacted; re-read and watch again"
                    )
                if result.get("canceled"):
                    reason = result.get("cancel_reason") or "no reason given"
                    raise MetaUnavailable(f"etcd cancelled the watch on {self.prefix!r}: {reason}")
                events = [
                    WatchEvent("delete" if e.get("type") == "DELETE" else "put", _kv(e["kv"]))
                    for e in result.get("events", [])
                ]
                if events:
                    self._events.put(events)
        except MetaUnavailable as e:
            if not self._cancelled.is_set():
                self._events.put(e)
        except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
            if not self._cancelled.is_set():
                what = f"no word for {self._idle_s} s" if isinstance(e, TimeoutError) else (str(e) or type(e).__name__)
                self._events.put(MetaUnavailable(f"etcd watch stream on {self.prefix!r} broke: {what}"))
        finally:
            self._conn.close()


def _line(raw: bytes) -> dict[str, Any]:
    msg = json.loads(raw)
    if not isinstance(msg, dict):
        raise ValueError(f"not a JSON object: {raw[:200]!r}")
    return msg
