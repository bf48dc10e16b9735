"""`fabric send`: messages from the arguments or stdin, one per line, with keys, headers and delays."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import click

from fabric.cli.common import DURATION, ENDPOINT, JSON, _emit, _reachable
from fabric.errors import FabricError, MessageTooLarge


def _lines(stream: Any) -> Iterable[bytes]:
    for line in stream:
        yield line.rstrip(b"\r\n")


@click.command()
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
@click.option(
    "--skip-too-large",
    is_flag=True,
    help="Skip a message over the queue's max_message_bytes (counted in the summary) instead of stopping there.",
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
    skip_too_large: bool,
    endpoint: str,
    as_json: bool,
) -> None:
    """Send MESSAGES to QUEUE, or one message per line of stdin when none are given. A send that
    fails partway (a message too large, the node gone) says how many lines were sent, acknowledged
    and failed and which line failed, and exits 1."""
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
    line_of: list[int] = []  # the input line (1-based) of each future
    skipped: list[int] = []  # with --skip-too-large: the lines not sent
    stopped: tuple[int, FabricError] | None = None  # the line whose send failed, which ends the send
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
                    try:
                        future = producer.send(
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
                    except MessageTooLarge as exc:
                        if skip_too_large:
                            skipped.append(n + 1)
                            continue
                        stopped = (n + 1, exc)
                        break
                    except FabricError as exc:
                        stopped = (n + 1, exc)
                        break
                    futures.append(future)
                    line_of.append(n + 1)
            try:
                producer.flush()
            except FabricError:
                pass  # each future holds its own outcome, counted below
        except KeyboardInterrupt:
            _interrupted(producer, futures, skipped)
    results: list[Any] = []
    failed: list[tuple[int, FabricError]] = []
    for line, f in zip(line_of, futures):
        try:
            results.append(f.result())
        except FabricError as exc:
            failed.append((line, exc))
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
    if skipped:
        summary["skipped_too_large"] = skipped[:1000]
    if unkeyed:
        summary["error"] = f"line {unkeyed} has no key separator {key_sep!r}: it and the lines after it were not sent"
    first_failure = min([*failed, *([stopped] if stopped else [])], key=lambda item: item[0], default=None)
    if first_failure is not None:
        line, error = first_failure
        summary["failed"] = len(failed) + (stopped is not None)
        summary["failed_line"] = line
        summary["error"] = f"{error.name}: line {line}: {error.message}"
        if stopped is not None:
            summary["error"] += f" (the lines after line {stopped[0]} were not sent)"
    _emit(summary, as_json, lambda s: _send_summary(s, results))
    if first_failure is not None:
        click.echo(
            f"error: {summary['error']}; {len(futures)} line(s) sent, {len(results)} acknowledged, "
            f"{summary['failed']} failed{_skipped(skipped)}",
            err=True,
        )
        sys.exit(1)
    if unkeyed:
        raise click.UsageError(summary["error"])


def _skipped(skipped: list[int]) -> str:
    return f", {len(skipped)} skipped as too large (line {', '.join(map(str, skipped[:10]))})" if skipped else ""


def _interrupted(producer: Any, futures: list[Any], skipped: list[int]) -> None:
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
        f"{len(futures) - acked - failed} unconfirmed{_skipped(skipped)}",
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
    if s.get("skipped_too_large"):
        text += f"; {len(s['skipped_too_large'])} line(s) skipped as too large"
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
