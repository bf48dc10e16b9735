"""The ``fabric`` command: run a node, administer queues, send, receive, benchmark.

The executable only merges flags, a config file and defaults; the logic lives in
the library. Human tables by default, ``--json`` for scripts. Errors print as
``error: CODE_NAME: message`` on stderr with exit status 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from fabric import __version__
from fabric.cli.cluster import cluster, node, router
from fabric.cli.common import DURATION, ENDPOINT, JSON, YES, _emit, _Group, _reachable, _table, confirm
from fabric.cli.groups import dlq, group
from fabric.cli.ready import announce_ready, up_cluster
from fabric.cli.security import acl, auth, quota
from fabric.cli.spark import spark
from fabric.cli.top import top
from fabric.cli.usage import usage
from fabric.errors import FabricError
from fabric.logs import configure as configure_logs


def _parse_value(raw: str) -> Any:
    for cast in (int,):
        try:
            return cast(raw)
        except ValueError:
            pass
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fabric")
def main() -> None:
    """fabric: a durable, fast message queue on ZeroMQ."""


# ---------------------------------------------------------------------- node


@main.command()
@click.option("--config", "-c", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--data-dir", "-d", help="Data directory (default ./fabric-data).")
@click.option("--listen", "-l", help="Endpoint to bind (default tcp://127.0.0.1:7420; port 0 picks one).")
@click.option(
    "--stream-listen",
    help="Also serve fabric's stream transport here (fabric://host:port; port 0 picks one): "
    "clients that connect to it skip ZeroMQ's I/O threads, for the lowest latency.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), help="Logging level.")
@click.option("--log-format", type=click.Choice(["text", "json"]), help="Log lines for people or JSON lines.")
@click.option(
    "--metrics-listen",
    metavar="HOST:PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks one; [metrics] listen in a config).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="When ready, print one JSON line (event, node, endpoint, stream_endpoint, pid, data_dir, ...) "
    "instead of the sentences: for scripts.",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    help="When ready, write the same JSON object to this file (atomically); removed at a clean stop.",
)
@click.option(
    "--ready-timeout",
    "ready_timeout_s",
    type=click.FloatRange(min=1),
    default=60,
    show_default=True,
    help="With a cluster config: seconds to wait for every store, a controller and every router "
    "before giving up (exit 1, naming what is missing).",
)
def up(
    config_path: str | None,
    data_dir: str | None,
    listen: str | None,
    stream_listen: str | None,
    log_level: str | None,
    log_format: str | None,
    metrics_listen: str | None,
    as_json: bool,
    ready_file: str | None,
    ready_timeout_s: float,
) -> None:
    """Start a node: every role in one process (the embedded single node), or with a cluster
    config every process it names (ready once the cluster is). Ctrl-C stops it."""
    from fabric.node.server import run
    from fabric.settings import load_config

    config = load_config(config_path)
    if config.cluster is not None:
        up_cluster(str(config_path), config, as_json, ready_file, ready_timeout_s)
        return
    given = {
        "data_dir": data_dir,
        "listen": listen,
        "stream_listen": stream_listen,
        "log_level": log_level,
        "log_format": log_format,
        "metrics_listen": metrics_listen,
    }
    if metrics_listen:
        from fabric.settings import check_metrics_listen

        try:
            check_metrics_listen(metrics_listen, "--metrics-listen")
        except FabricError as exc:
            raise click.UsageError(exc.message) from None
    changes = {k: v for k, v in given.items() if v}
    if changes.get("listen", "").endswith(":0"):
        changes["listen"] = changes["listen"][:-2] + ":*"
    if changes.get("stream_listen") and not changes["stream_listen"].startswith("fabric://"):
        raise click.UsageError(f"--stream-listen must look like fabric://host:port, got {stream_listen!r}")
    config = config.replace(**changes)
    configure_logs(config.log_level, config.log_format, config.node_id)

    def ready(server: Any) -> None:
        reports = server.store.recovery_reports()
        dropped = sum(getattr(r, "bytes_truncated", 0) for r in reports.values()) if isinstance(reports, dict) else 0
        info = {
            "event": "ready",
            "version": __version__,
            "node": config.node_id,
            "endpoint": server.endpoint,
            "stream_endpoint": server.stream_endpoint or None,
            "metrics_endpoint": server.metrics_endpoint or None,
            "pid": os.getpid(),
            "data_dir": str(Path(config.data_dir).resolve()),
            "queues": len(server.store.queue_names()),
            "startup_ms": server.startup_ms,
            "recovery_dropped_bytes": dropped,
        }
        announce_ready(info, as_json, ready_file)
        if as_json:
            return
        click.echo(
            f"fabric {__version__} node {config.node_id} ready on {server.endpoint} "
            f"(data: {Path(config.data_dir).resolve()}, queues: {len(server.store.queue_names())}, "
            f"started in {server.startup_ms} ms, recovery dropped {dropped} bytes)"
        )
        if server.stream_endpoint:
            click.echo(f"stream transport on {server.stream_endpoint} (lowest latency: connect clients there)")
        if server.metrics_endpoint:
            click.echo(f"Prometheus metrics on {server.metrics_endpoint}")
        click.echo("Ctrl-C to stop.")
        sys.stdout.flush()

    try:
        run(config, on_ready=ready)
    finally:
        if ready_file:
            Path(ready_file).unlink(missing_ok=True)
    if not as_json:
        click.echo("fabric node stopped cleanly.")


@main.command()
@ENDPOINT
@JSON
def ping(endpoint: str, as_json: bool) -> None:
    """Check that a node answers; print its id, version and counters."""
    from fabric.client import Admin

    with Admin(endpoint, timeout_ms=3000) as admin:
        t0 = time.perf_counter()
        info = admin.ping()
        info["rtt_us"] = int((time.perf_counter() - t0) * 1e6)
    _emit(
        info,
        as_json,
        lambda d: f"node {d['node']} (fabric {d['version']}) at {endpoint}: {d['queues']} queues, rtt {d['rtt_us']} us",
    )


# ---------------------------------------------------------------------- queues


@main.group(cls=_Group)
def queue() -> None:
    """Create, list, describe and delete queues."""


@queue.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=click.IntRange(1, 4096), help="Number of partitions (default 1).")
@click.option("--fsync", type=click.Choice(["always", "interval", "never"]), help="Fsync policy (default always).")
@click.option("--retention-ms", type=click.IntRange(min=0), help="Delete segments older than this (0 = keep).")
@click.option("--max-message-bytes", type=click.IntRange(min=1), help="Largest message accepted.")
@click.option("--max-messages", type=click.IntRange(min=0), help="Queue size limit in messages (0 = none).")
@click.option("--max-bytes", type=click.IntRange(min=0), help="Queue size limit in bytes (0 = none).")
@click.option(
    "--overflow", type=click.Choice(["reject", "dead_letter_oldest"]), help="At max-messages (default reject)."
)
@click.option("--ordering", type=click.Choice(["fifo", "strict"]), help="strict: by the producers' clocks.")
@click.option("--ordering-window", "ordering_window_ms", type=DURATION, help="strict: how long to wait for stragglers.")
@click.option("--priority-levels", type=click.IntRange(1, 10), help="Priority levels 0..N-1 (default 1: none).")
@click.option("--default-ttl", "default_ttl_ms", type=DURATION, help="Queue subscriptions expire messages after this.")
@click.option("--on-expire", type=click.Choice(["dead_letter", "drop"]), help="What expiry does (default dead_letter).")
@click.option("--dedup-window", "dedup_window_ms", type=DURATION, help="Drop messages whose dedup id was seen within.")
@click.option(
    "--max-receive-count", type=click.IntRange(min=0), help="Deliveries before a message is dead-lettered (0 = never)."
)
@click.option("--visibility-timeout", "visibility_timeout_ms", type=DURATION, help="Lease length of a delivery.")
@click.option("--set", "extra", multiple=True, metavar="KEY=VALUE", help="Any other queue setting.")
@click.option("--if-not-exists", is_flag=True, help="Succeed if the queue already exists.")
@ENDPOINT
@JSON
def queue_create(
    name: str, extra: tuple[str, ...], if_not_exists: bool, endpoint: str, as_json: bool, **opts: Any
) -> None:
    """Create queue NAME."""
    from fabric.client import Admin

    settings = {k: v for k, v in opts.items() if v is not None}
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--set")
        settings[key.strip()] = _parse_value(value.strip())
    with Admin(endpoint) as admin:
        d = admin.create_queue(name, if_not_exists=if_not_exists, **settings)
    _emit(
        d, as_json, lambda d: f"queue {d['name']} ready: {d['partitions']} partition(s), fsync {d['settings']['fsync']}"
    )


@queue.command("list")
@click.option("--prefix", help="Only queues whose names start with this.")
@ENDPOINT
@JSON
def queue_list(prefix: str | None, endpoint: str, as_json: bool) -> None:
    """List queues with their sizes (every one: the node is asked page by page)."""
    from fabric.client import Admin

    with Admin(endpoint) as admin:
        rows = admin.list_queues(prefix)
    _emit(rows, as_json, lambda r: _table(r, ["name", "partitions", "messages", "size_bytes"]))


@queue.command("describe")
@click.argument("name")
@ENDPOINT
@JSON
def queue_describe(name: str, endpoint: str, as_json: bool) -> None:
    """Show a queue's settings, partitions, offsets, groups and lag."""
    from fabric.client import Admin

    with Admin(endpoint) as admin:
        d = admin.describe_queue(name)

    def human(d: dict[str, Any]) -> str:
        head = f"queue {d['name']}: {d['messages']} messages, {d['size_bytes']} bytes on disk"
        if d.get("encrypted"):
            head += " (encrypted at rest)"
        if d.get("delayed", {}).get("batches"):
            head += f", {d['delayed']['batches']} delayed batch(es)"
        if d.get("priority_levels", 1) > 1:
            head += f", priority levels 0..{d['priority_levels'] - 1} (partition log = level * {d['partitions']} + p)"
        out = [head]
        cols = ["partition", "log_start_offset", "high_watermark", "messages", "size_bytes", "segments"]
        out.append(_table(d["partition_detail"], cols))
        out += [
            f"partition {x['partition']} NOT SERVED: {x['refused']}" for x in d["partition_detail"] if x.get("refused")
        ]
        for g, info in d["groups"].items():
            line = f"group {g}: total lag {info['total_lag']} ({info.get('lag_seconds', 0)} s)"
            if info.get("kind") == "queue":
                line += f", in flight {info['in_flight']}, redeliverable {info['redeliverable']}"
            out.append(line + f", committed {info['committed']}")
        dl = d.get("dead_letters")
        if dl:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(dl["reasons"].items())) or "none"
            out.append(f"dead letters: {dl['messages']} in {dl['queue']} (reasons: {reasons})")
        out.append(f"subscriptions: {len(d['subscriptions'])}")
        out.append("settings: " + ", ".join(f"{k}={v}" for k, v in d["settings"].items()))
        return "\n".join(out)

    _emit(d, as_json, human)


@queue.command("alter")
@click.argument("name")
@click.option(
    "--partitions",
    "-p",
    type=click.IntRange(1, 4096),
    required=True,
    help="Grow to this many partitions (only ever added; keyed messages then hash over the new count).",
)
@ENDPOINT
@JSON
def queue_alter(name: str, partitions: int, endpoint: str, as_json: bool) -> None:
    """Add partitions to queue NAME. Existing partitions keep their data and numbers; a key whose
    partition changes (crc32c(key) % partitions) is read in order only from the change on."""
    from fabric.client import Admin

    with Admin(endpoint) as admin:
        d = admin.alter_queue(name, partitions=partitions)
    _emit(
        d,
        as_json,
        lambda d: (
            f"queue {d['name']}: {d['partitions']} partition(s)"
            + (f" ({d['added']} added)" if d["added"] else " (unchanged)")
        ),
    )


@queue.command("delete")
@click.argument("name")
@YES
@click.option("--if-exists", is_flag=True, help="Succeed if the queue does not exist.")
@ENDPOINT
def queue_delete(name: str, yes: bool, if_exists: bool, endpoint: str) -> None:
    """Delete queue NAME and all its data (asks first; without a terminal, needs --yes)."""
    from fabric.client import Admin

    confirm(f"Delete queue {name} and all its messages?", yes)
    with Admin(endpoint) as admin:
        deleted = admin.delete_queue(name, if_exists=if_exists)
    click.echo(f"queue {name} deleted" if deleted else f"queue {name} did not exist")


# ---------------------------------------------------------------------- send / receive


def _lines(stream: Any) -> Iterable[bytes]:
    for line in stream:
        yield line.rstrip(b"\r\n")


@main.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("messages", nargs=-1)
@click.option("--key", "-k", help="Message key (same key, same partition, in order).")
@click.option("--partition", type=click.IntRange(0, 65535), help="Send to this partition.")
@click.option("--acks", type=click.Choice(["none", "leader", "all"]), default="leader", show_default=True)
@click.option("--linger-ms", type=float, default=5, show_default=True)
@click.option("--compression", type=click.Choice(["none", "lz4"]), default="none", show_default=True)
@click.option("--header", "-H", "headers", multiple=True, metavar="NAME=VALUE", help="A message header (repeatable).")
@click.option("--delay", "delay_ms", type=DURATION, help="Deliver after this long (500ms, 3s, 5m, 2h, 30d).")
@click.option("--deliver-at", "deliver_at", help="Deliver at this time: ISO 8601 (2026-12-01T09:00:00Z) or epoch ms.")
@click.option("--ttl", "ttl_ms", type=DURATION, help="Expire if not consumed within this long of sending.")
@click.option("--priority", type=click.IntRange(0, 9), help="Priority level (queues with priority_levels).")
@click.option(
    "--dedup-id",
    help="Message id for the queue's dedup window; with several messages, {n} in it becomes the message's number.",
)
@click.option(
    "--key-separator",
    "-K",
    "key_sep",
    metavar="SEP",
    help="Each message (or stdin line) is KEY SEP VALUE, split at the first SEP: per-message keys "
    "from a file (-K $'\\t' for tab-separated lines).",
)
@ENDPOINT
@JSON
def send(
    queue_name: str,
    messages: tuple[str, ...],
    key: str | None,
    partition: int | None,
    acks: str,
    linger_ms: float,
    compression: str,
    headers: tuple[str, ...],
    delay_ms: int | None,
    deliver_at: str | None,
    ttl_ms: int | None,
    priority: int | None,
    dedup_id: str | None,
    key_sep: str | None,
    endpoint: str,
    as_json: bool,
) -> None:
    """Send MESSAGES to QUEUE, or one message per line of stdin when none are given."""
    from fabric.client import Producer

    deliver_at_ms = _parse_time_ms(deliver_at) if deliver_at is not None else None
    if dedup_id is not None and (len(messages) != 1 and "{n}" not in dedup_id):
        raise click.BadParameter("several messages need {n} in the id (e.g. order-{n})", param_hint="--dedup-id")
    split_at = None  # bytes: the key separator
    if key_sep is not None:
        if not key_sep:
            raise click.BadParameter("the separator is empty", param_hint="--key-separator")
        if key is not None:
            raise click.BadParameter("--key gives every message one key; --key-separator reads one per message")
        split_at = key_sep.encode()
        bad = next((i for i, m in enumerate(messages) if key_sep not in m), None)
        if bad is not None:  # arguments are checked before anything is sent
            raise click.BadParameter(f"message {bad + 1} ({messages[bad]!r}) has no {key_sep!r}: nothing was sent")

    hdrs: dict[str, bytes | str] = {}
    for item in headers:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--header")
        hdrs[name] = value
    _reachable(endpoint)
    source: Iterable[bytes] = (m.encode() for m in messages) if messages else _lines(sys.stdin.buffer)
    futures: list[Any] = []
    unkeyed = 0  # with --key-separator: the number of the stdin line without one, which ends the send
    t0 = time.perf_counter()
    with Producer(endpoint, acks=acks, linger_ms=linger_ms, compression=compression) as producer:
        bar = not messages and sys.stderr.isatty()
        progress = click.progressbar(source, label="sending", file=sys.stderr, show_pos=True) if bar else None
        try:
            with progress or _nullbar(source) as items:
                for n, payload in enumerate(items):
                    this_key: str | bytes | None = key
                    if split_at is not None:
                        this_key, found, payload = payload.partition(split_at)
                        if not found:
                            unkeyed = n + 1
                            break
                    futures.append(
                        producer.send(
                            queue_name,
                            payload,
                            key=this_key,
                            partition=partition,
                            headers=hdrs or None,
                            delay_ms=delay_ms,
                            deliver_at_ms=deliver_at_ms,
                            ttl_ms=ttl_ms,
                            priority=priority,
                            dedup_id=dedup_id.replace("{n}", str(n)) if dedup_id is not None else None,
                        )
                    )
            producer.flush()
        except KeyboardInterrupt:
            _interrupted(producer, futures)
    results = [f.result() for f in futures]
    elapsed = time.perf_counter() - t0
    summary: dict[str, Any] = {
        "queue": queue_name,
        "sent": len(results),
        "seconds": round(elapsed, 3),
        "offsets": [[r.partition, r.offset] for r in results[:1000]],
        "duplicates": sum(r.duplicate for r in results),
    }
    delayed = [r.delayed_until_ms for r in results if r.delayed_until_ms is not None]
    if delayed:
        summary["delayed_until_ms"] = max(delayed)
    if unkeyed:
        summary["error"] = f"line {unkeyed} has no key separator {key_sep!r}: it and the lines after it were not sent"
    _emit(summary, as_json, lambda s: _send_summary(s, results))
    if unkeyed:
        raise click.UsageError(summary["error"])


def _interrupted(producer: Any, futures: list[Any]) -> None:
    """Ctrl-C during a send: wait a little for what is in flight, say what got where, exit 130."""
    try:
        producer.flush(timeout=5)
    except (Exception, KeyboardInterrupt):
        pass
    acked = failed = 0
    for f in futures:
        if f.done():
            try:
                f.result(timeout=0)
                acked += 1
            except FabricError:
                failed += 1
    click.echo(
        f"interrupted: {len(futures)} line(s) sent, {acked} acknowledged, {failed} failed, "
        f"{len(futures) - acked - failed} unconfirmed",
        err=True,
    )
    sys.exit(130)


def _send_summary(s: dict[str, Any], results: list[Any]) -> str:
    text = f"sent {s['sent']} message(s) to {s['queue']} in {s['seconds']} s"
    stored = [r for r in results if r.offset is not None]
    if stored:
        text += f"; first at partition {stored[0].partition} offset {stored[0].offset}"
    if s["duplicates"]:
        text += f"; {s['duplicates']} duplicate(s) dropped by the dedup window"
    if "delayed_until_ms" in s:
        when = datetime.fromtimestamp(s["delayed_until_ms"] / 1000, UTC).isoformat(timespec="milliseconds")
        text += f"; delayed until {when}"
    return text


def _parse_time_ms(text: str) -> int:
    """An absolute time: epoch milliseconds, or ISO 8601 (no zone means UTC)."""
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither epoch ms nor an ISO 8601 time", param_hint="--deliver-at"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


class _nullbar:
    def __init__(self, items: Iterable[Any]) -> None:
        self.items = items

    def __enter__(self) -> Iterable[Any]:
        return self.items

    def __exit__(self, *exc: object) -> None:
        return None


def _start(value: str) -> str | int:
    return int(value) if value.isdigit() else value


def _print_messages(
    consumer: Any,
    count: int | None,
    idle_ms: int | None,
    as_json: bool,
    follow: bool,
    max_wait_ms: int | None = None,
    key_sep: str | None = None,
) -> int:
    """Print until ``count`` messages, ``idle_ms`` with nothing new (None: never), ``max_wait_ms`` in
    all, or Ctrl-C. A stream consumer in a group commits exactly what was printed; a queue member
    acks what was printed and gives the rest back."""
    got = 0
    printed_upto: dict[int, int] = {}  # partition -> offset after the last printed message
    now = time.monotonic()
    idle_deadline = None if idle_ms is None else now + idle_ms / 1000
    total_deadline = None if max_wait_ms is None else now + max_wait_ms / 1000
    shared = getattr(consumer, "shared", False)
    try:
        while count is None or got < count:
            now = time.monotonic()
            deadlines = [d for d in (idle_deadline, total_deadline) if d is not None]
            left = int((min(deadlines) - now) * 1000) if deadlines else 1000
            if left <= 0 and not (follow and total_deadline is None):
                break
            batch = consumer.poll_batch(max(0, min(left, 1000)))
            if batch is None:
                continue
            if idle_ms is not None:
                idle_deadline = time.monotonic() + idle_ms / 1000
            messages = batch.messages()
            printed = 0
            for m in messages:
                if count is not None and got >= count:
                    break
                got += 1
                printed += 1
                if as_json:
                    click.echo(json.dumps(_record(m)))
                elif key_sep is not None:
                    key = m.key.decode(errors="replace") if m.key is not None else ""
                    click.echo(key + key_sep + m.value.decode(errors="replace"))
                else:
                    click.echo(m.value.decode(errors="replace"))
                printed_upto[m.partition] = m.offset + 1
            sys.stdout.flush()
            if shared:  # queue subscription: settle what was printed, give back the rest
                if printed:
                    consumer.ack(messages[:printed])
                if printed < len(messages):
                    consumer.nack(messages[printed:])
    finally:
        if not shared and consumer.group is not None and printed_upto:
            consumer.commit(printed_upto)
    return got


def _record(m: Any) -> dict[str, Any]:
    rec = {
        "partition": m.partition,
        "offset": m.offset,
        "timestamp_ms": m.timestamp_ms,
        "value": m.value.decode(errors="replace"),
    }
    if m.key is not None:
        rec["key"] = m.key.decode(errors="replace")
    if m.headers:
        rec["headers"] = {k: v.decode(errors="replace") for k, v in m.headers.items()}
    return rec


@main.command()
@click.argument("queue_name", metavar="QUEUE")
@click.option("--group", "-g", help="Consumer group: resume from and commit its offsets.")
@click.option(
    "--from", "start", default="committed", show_default=True, help="earliest, latest, committed, or an offset."
)
@click.option("--count", "-n", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=0),
    default=5000,
    show_default=True,
    help="Stop once nothing arrived for this long (an idle timeout, restarted by every message).",
)
@click.option("--max-wait", "max_wait_ms", type=DURATION, help="Stop after this long in all (e.g. 30s), idle or not.")
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(0, 65535),
    multiple=True,
    help="Only these partitions (repeatable).",
)
@click.option(
    "--kind",
    type=click.Choice(["stream", "queue", "key_shared"]),
    default="stream",
    show_default=True,
    help="stream: offsets, partitions shared out in a group; queue: shared, each message leased and acked; "
    "key_shared: like queue, one member per key at a time.",
)
@click.option(
    "--key-separator",
    "-K",
    "key_sep",
    metavar="SEP",
    help="Print KEY SEP VALUE (an empty key for a message without one), as `fabric send -K` reads it.",
)
@ENDPOINT
@JSON
def recv(
    queue_name: str,
    group: str | None,
    start: str,
    count: int | None,
    timeout_ms: int,
    max_wait_ms: int | None,
    partitions: tuple[int, ...],
    kind: str,
    key_sep: str | None,
    endpoint: str,
    as_json: bool,
) -> None:
    """Receive messages from QUEUE and print one per line (JSON lines with --json).
    With a --group, commits exactly what it printed (the group's next consumer gets the rest);
    with --kind queue or key_shared every printed message is acknowledged; the others go back."""
    if kind != "stream" and group is None:
        raise click.BadParameter("a queue subscription needs --group", param_hint="--kind")
    from fabric.client import Consumer

    if start == "committed" and group is None:
        start = "earliest"
    _reachable(endpoint)
    # a queue subscription leases only what it will print: the rest stays for other consumers
    credit = min(count, 10_000) if kind != "stream" and count else 20_000
    with Consumer(
        queue_name,
        endpoint,
        group=group,
        start=_start(start),
        partitions=list(partitions) or None,
        kind=kind,
        credit_messages=credit,
        auto_commit=False,  # commit what was printed, not what arrived
    ) as c:
        got = _print_messages(c, count, timeout_ms, as_json, follow=False, max_wait_ms=max_wait_ms, key_sep=key_sep)
    if not as_json:
        click.echo(f"({got} message(s))", err=True)


@main.command()
@click.argument("queue_name", metavar="QUEUE")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new messages until Ctrl-C.")
@click.option(
    "--lines",
    "-n",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Start this many messages before the end of each partition.",
)
@ENDPOINT
@JSON
def tail(queue_name: str, follow: bool, lines: int, endpoint: str, as_json: bool) -> None:
    """Print the last messages of QUEUE; with -f, follow new ones."""
    from fabric.client import Admin, Consumer

    with Admin(endpoint) as admin:
        d = admin.describe_queue(queue_name)
    offsets = {p["partition"]: max(p["log_start_offset"], p["high_watermark"] - lines) for p in d["partition_detail"]}
    c = Consumer(queue_name, endpoint, start="latest", offsets=offsets)
    try:
        _print_messages(c, None, None if follow else 1500, as_json, follow=follow)
    except KeyboardInterrupt:
        pass
    finally:
        c.close()


# ---------------------------------------------------------------------- demo and bench


@main.command()
@click.option("--messages", "-n", type=click.IntRange(min=1), default=200_000, show_default=True)
@click.option("--size", type=click.IntRange(min=8), default=100, show_default=True, help="Message size in bytes.")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Keep the demo's data here (default: a temp dir).")
def demo(messages: int, size: int, data_dir: str | None) -> None:
    """Start an embedded node, send and receive messages through it, show the numbers, stop."""
    from fabric.demo import run_demo

    run_demo(messages=messages, size=size, data_dir=data_dir)


@main.command()
@click.option(
    "--endpoint", "-e", envvar="FABRIC_ENDPOINT", help="Bench a running node (default: start a fresh embedded one)."
)
@click.option("--mode", type=click.Choice(["throughput", "latency"]), default="throughput", show_default=True)
@click.option("--messages", "-n", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--size", type=click.IntRange(min=8), default=100, show_default=True)
@click.option("--batch-bytes", type=click.IntRange(min=1), default=256 * 1024, show_default=True)
@click.option("--linger-ms", type=float, default=5, show_default=True)
@click.option("--acks", type=click.Choice(["none", "leader", "all"]), default="leader", show_default=True)
@click.option("--fsync", type=click.Choice(["always", "interval", "never"]), default="always", show_default=True)
@click.option("--compression", type=click.Choice(["none", "lz4"]), default="none", show_default=True)
@click.option("--partitions", type=click.IntRange(1, 4096), default=1, show_default=True)
@click.option(
    "--replication-factor",
    type=click.IntRange(0, 16),
    default=0,
    show_default=True,
    help="Against a cluster (-e): replicas of the bench queue (0: the cluster's default).",
)
@click.option(
    "--kind",
    type=click.Choice(["stream", "queue", "key_shared"]),
    default="stream",
    show_default=True,
    help="queue: a queue subscription that leases and acks every message; key_shared: the same, 1,000 keys.",
)
@click.option(
    "--idempotent/--no-idempotent", default=True, show_default=True, help="Idempotent producer (the default)."
)
@click.option(
    "--commit/--no-commit",
    default=True,
    show_default=True,
    help="stream: the consumer is a group member that commits after every poll, as a user would run it.",
)
@click.option(
    "--rate", type=click.IntRange(min=1), default=5000, show_default=True, help="Latency mode: messages per second."
)
@click.option("--seconds", type=float, default=10, show_default=True, help="Latency mode: how long.")
@click.option(
    "--send-many",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Throughput mode: the producer calls Producer.send_many with this many values per call "
    "(the bulk form of send; as the harness pipelines) instead of one send per value (0).",
)
@click.option("--runs", type=click.IntRange(min=1), default=1, show_default=True, help="Repeat and report the median.")
@click.option("--compare-zmq", is_flag=True, help="Also measure raw pyzmq PUSH/PULL in the same run.")
@click.option(
    "--transport",
    type=click.Choice(["zmq", "stream"]),
    default="zmq",
    show_default=True,
    help="The embedded node's transport for the clients: zmq (tcp://) or stream (fabric://).",
)
@click.option("--auth", is_flag=True, help="The embedded node authenticates: CurveZMQ on zmq, TLS on stream.")
@JSON
def bench(as_json: bool, **opts: Any) -> None:
    """Producer -> fabric -> consumer end to end: msgs/s, MB/s, latency p50/p99/p999."""
    from fabric.bench.single import run_bench

    result = run_bench(**opts, progress=not as_json and sys.stderr.isatty())
    if as_json:
        click.echo(json.dumps(result, indent=2))


@main.command("bench-cluster")
@click.option("--messages", "-n", type=click.IntRange(min=1000), default=300_000, show_default=True)
@click.option("--size", type=click.IntRange(min=1), default=100, show_default=True, help="Payload bytes.")
@click.option("--acks", type=click.Choice(["none", "leader", "all"]), default="all", show_default=True)
@click.option("--stores", type=click.IntRange(1, 9), default=3, show_default=True, help="Storage nodes.")
@click.option("--routers", type=click.IntRange(1, 9), default=2, show_default=True)
@click.option("--rf", type=click.IntRange(1, 9), default=3, show_default=True, help="Replication factor.")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Rounds of each; medians.")
@JSON
def bench_cluster(as_json: bool, **opts: Any) -> None:
    """Produce throughput through the router tier and straight to the leaders, side by side, on a
    cluster started for the run on loopback (etcd members, stores, routers; removed at the end)."""
    from fabric.bench.cluster import run_cluster_bench

    if opts["rf"] > opts["stores"]:
        raise click.UsageError("--rf may not exceed --stores")
    result = run_cluster_bench(**opts, progress=not as_json)
    if as_json:
        click.echo(json.dumps(result, indent=2))


@main.command("bench-direct")
@click.option("--messages", "-n", type=click.IntRange(min=100), default=20_000, show_default=True)
@click.option("--size", type=click.IntRange(min=8), default=100, show_default=True, help="Payload bytes.")
@click.option("--rate", type=click.IntRange(min=1), default=5000, show_default=True, help="Messages per second.")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Rounds of each; medians.")
@JSON
def bench_direct(as_json: bool, **opts: Any) -> None:
    """One-way latency of a direct (brokerless) queue against raw pyzmq PUSH/PULL, side by side."""
    from fabric.bench.direct import run_direct_bench

    result = run_direct_bench(**opts, progress=not as_json)
    if as_json:
        click.echo(json.dumps(result, indent=2))


main.add_command(group)
main.add_command(usage)
main.add_command(top)
main.add_command(dlq)
main.add_command(node)
main.add_command(cluster)
main.add_command(router)
main.add_command(auth)
main.add_command(acl)
main.add_command(quota)
main.add_command(spark)
