"""`fabric ack`, `fabric nack`, `fabric change-visibility`: settle a queue group's messages by
the receipt handles `fabric recv --kind queue --no-ack` printed (as `aws sqs delete-message`,
`change-message-visibility`)."""

from __future__ import annotations

import sys
from typing import Any

import click

from fabric.cli.common import DURATION, ENDPOINT, JSON, _admin, _emit

_HANDLES = click.argument("handles", nargs=-1, metavar="[HANDLE]...")


def _handles(given: tuple[str, ...]) -> list[str]:
    """The handles given, or without any, the first field of each stdin line (so the output of
    `fabric recv --no-ack` pipes in as it is); none at all is a usage error."""
    handles = list(given)
    if not handles and not sys.stdin.isatty():
        handles = [line.split()[0] for line in sys.stdin if line.strip()]
    if not handles:
        raise click.UsageError("name the receipt handles (or pipe `fabric recv --no-ack` output in)")
    return handles


def _settle(queue: str, group: str, handles: tuple[str, ...], action: str, endpoint: str, **opts: Any) -> int:
    with _admin(endpoint) as admin:
        return admin.settle(queue, group, _handles(handles), action, **opts)


@click.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group")
@_HANDLES
@ENDPOINT
@JSON
def ack(queue_name: str, group: str, handles: tuple[str, ...], endpoint: str, as_json: bool) -> None:
    """Acknowledge (delete) messages of queue group GROUP by receipt handle. A handle whose lease
    ended (its visibility timeout passed: it may be delivered again) is an error naming it."""
    n = _settle(queue_name, group, handles, "ack", endpoint)
    _emit({"queue": queue_name, "group": group, "acked": n}, as_json, lambda d: f"acked {n} message(s)")


@click.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group")
@_HANDLES
@click.option("--delay", "delay_ms", type=DURATION, default=0, help="Redeliver after this long (e.g. 30s).")
@ENDPOINT
@JSON
def nack(queue_name: str, group: str, handles: tuple[str, ...], delay_ms: int, endpoint: str, as_json: bool) -> None:
    """Give messages of queue group GROUP back for redelivery, by receipt handle (each counts as a
    delivery toward the queue's max_receive_count)."""
    n = _settle(queue_name, group, handles, "nack", endpoint, delay_ms=delay_ms)
    _emit({"queue": queue_name, "group": group, "nacked": n}, as_json, lambda d: f"gave back {n} message(s)")


@click.command("change-visibility")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("group")
@_HANDLES
@click.option(
    "--visibility-timeout",
    "visibility_ms",
    type=DURATION,
    required=True,
    help="Keep the messages leased this long from now (e.g. 5m; 0 redelivers them at once).",
)
@ENDPOINT
@JSON
def change_visibility(
    queue_name: str, group: str, handles: tuple[str, ...], visibility_ms: int, endpoint: str, as_json: bool
) -> None:
    """Extend or shorten the leases of messages of queue group GROUP, by receipt handle."""
    if visibility_ms > 12 * 3600 * 1000:
        raise click.BadParameter("at most 12h", param_hint="--visibility-timeout")
    n = _settle(queue_name, group, handles, "visibility", endpoint, visibility_ms=visibility_ms)
    _emit(
        {"queue": queue_name, "group": group, "changed": n},
        as_json,
        lambda d: f"{n} message(s) leased for {visibility_ms} ms more",
    )
