"""`fabric recv` and `fabric tail`: print a queue's messages (one per line, or JSON lines)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Any

import click

from fabric.cli.common import DURATION, ENDPOINT, JSON, Interrupted, _admin, _reachable


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
    markers: bool = False,
    no_ack: bool = False,
) -> int:
    """Print until ``count`` messages, ``idle_ms`` with nothing new (None: never), ``max_wait_ms`` in
    all, or Ctrl-C (:class:`Interrupted`, saying how many were printed, once the group has
    committed them). A stream consumer in a group commits exactly what was printed; a queue member
    acks what was printed (``no_ack``: prints its receipt handle first and leaves it leased) and
    gives the rest back. ``markers``: a ``==> partition N <==`` line before the messages of each
    partition run (as tail(1) heads each file)."""
    got = 0
    marked: int | None = None
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
                with _whole:  # printed is recorded as printed, also on Ctrl-C right after it
                    if markers and m.partition != marked:
                        click.echo(f"==> partition {m.partition} <==")
                        marked = m.partition
                    got += 1
                    printed += 1
                    handle = consumer.receipt_handle(m) if no_ack else None
                    if as_json:
                        rec = _record(m)
                        if handle is not None:
                            rec["receipt_handle"] = handle
                        click.echo(json.dumps(rec))
                    elif handle is not None:
                        click.echo(handle + "\t" + m.value.decode(errors="replace"))
                    elif key_sep is not None:
                        key = m.key.decode(errors="replace") if m.key is not None else ""
                        click.echo(key + key_sep + m.value.decode(errors="replace"))
                    else:
                        click.echo(m.value.decode(errors="replace"))
                    printed_upto[m.partition] = m.offset + 1
            sys.stdout.flush()
            if follow and not shared and consumer.group is not None and printed:
                consumer.commit(printed_upto)  # following for hours: what was printed stays committed
            if shared:  # queue subscription: settle what was printed, give back the rest
                if printed and not no_ack:
                    consumer.ack(messages[:printed])
                if printed < len(messages):
                    consumer.nack(messages[printed:])
    except KeyboardInterrupt:
        settled = "acknowledged" if shared and not no_ack else "committed" if consumer.group is not None else ""
        settled = "left leased" if no_ack else settled
        raise Interrupted(f"{got} message(s) printed" + (f" and {settled}" if settled else "")) from None
    finally:
        if not shared and consumer.group is not None and printed_upto:
            consumer.commit(printed_upto)
    return got


class _Whole:
    """A step Ctrl-C does not cut in two: a SIGINT during it is raised once it is done."""

    def __init__(self) -> None:
        self.pending = False
        self.before: Any = None

    def _later(self, signum: int, frame: Any) -> None:
        self.pending = True

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.before = signal.signal(signal.SIGINT, self._later)

    def __exit__(self, *exc: object) -> None:
        if self.before is not None:
            signal.signal(signal.SIGINT, self.before)
            self.before = None
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt


_whole = _Whole()


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


@click.command()
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
    "--follow",
    "-f",
    is_flag=True,
    help="Keep printing new messages until Ctrl-C (needs --group; commits or acks what it printed as it "
    "goes; --timeout-ms does not apply). Exits 130 with how many it printed.",
)
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
@click.option(
    "--no-ack",
    is_flag=True,
    help="--kind queue: print each message's receipt handle (HANDLE<TAB>VALUE; --json: receipt_handle) "
    "and leave it leased until its visibility timeout, to settle with `fabric ack`, `fabric nack` or "
    "`fabric change-visibility` (as `aws sqs receive-message`).",
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
    follow: bool,
    partitions: tuple[int, ...],
    kind: str,
    key_sep: str | None,
    no_ack: bool,
    endpoint: str,
    as_json: bool,
) -> None:
    """Receive messages from QUEUE and print one per line (JSON lines with --json).
    With a --group, commits exactly what it printed (the group's next consumer gets the rest);
    with --kind queue or key_shared every printed message is acknowledged; the others go back.
    With --follow, it stays a member of the group until Ctrl-C (as Kafka's console consumer and
    `nats sub` do), committing what it printed as it goes."""
    if kind != "stream" and group is None:
        raise click.BadParameter("a queue subscription needs --group", param_hint="--kind")
    if no_ack and kind != "queue":
        raise click.BadParameter(
            "receipt handles are for --kind queue (leased, settled one by one)", param_hint="--no-ack"
        )
    if no_ack and key_sep is not None:
        raise click.BadParameter("--no-ack prints HANDLE<TAB>VALUE; it does not take -K", param_hint="--no-ack")
    if follow and group is None:
        raise click.BadParameter(
            "--follow reads as a member of a consumer group: name one with --group "
            "(`fabric tail -f` follows without a group)",
            param_hint="--follow",
        )
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
        idle_ms = None if follow else timeout_ms
        try:
            got = _print_messages(
                c, count, idle_ms, as_json, follow=follow, max_wait_ms=max_wait_ms, key_sep=key_sep, no_ack=no_ack
            )
        finally:
            if no_ack:
                c.close(keep_leases=True)  # what was printed stays leased, for its receipt handle
    if no_ack and not as_json:
        click.echo(
            f"({got} message(s) leased until their visibility timeout: settle them with "
            f"`fabric ack {queue_name} {group} HANDLE...`, nack or change-visibility)",
            err=True,
        )
    elif not as_json:
        click.echo(f"({got} message(s))", err=True)


@click.command()
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
    """Print the last messages of QUEUE; with -f, follow new ones. With several partitions, a
    ``==> partition N <==`` line heads each partition's messages (not with --json: each record
    names its partition)."""
    from fabric.client import Consumer

    with _admin(endpoint) as admin:
        d = admin.describe_queue(queue_name)
    offsets = {p["partition"]: max(p["log_start_offset"], p["high_watermark"] - lines) for p in d["partition_detail"]}
    c = Consumer(queue_name, endpoint, start="latest", offsets=offsets)
    try:
        several = len(d["partition_detail"]) > 1
        _print_messages(c, None, None if follow else 1500, as_json, follow=follow, markers=several and not as_json)
    finally:
        c.close()
