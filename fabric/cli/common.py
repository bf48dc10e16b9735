"""What every `fabric` command shares: the endpoint and --json options, tables, error exits."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from fabric.errors import FabricError


def _endpoint(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A malformed endpoint is a usage error (exit 2) naming the accepted forms."""
    from fabric.transport.endpoints import check_endpoint

    if value is None:
        return None
    try:
        return check_endpoint(value)
    except FabricError as exc:
        raise click.BadParameter(exc.message) from None


YES = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")


def confirm(question: str, yes: bool) -> None:
    """Ask before a destructive step. Without a terminal on stdin and without --yes, refuse with
    exit code 2: a pipe or a script must say --yes in so many words (`echo n | ...` deletes nothing)."""
    if yes:
        return
    if not sys.stdin.isatty():
        click.echo(f"error: {question} Not confirmed: stdin is not a terminal; pass --yes to confirm.", err=True)
        sys.exit(2)
    click.confirm(question, abort=True)


JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


def _fail(exc: FabricError) -> None:
    click.echo(f"error: {exc.name}: {exc.message}", err=True)
    sys.exit(1)


class Interrupted(Exception):
    """Ctrl-C ended a long-running command; ``summary`` says what it did before (exit 130)."""

    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary


class _Group(click.Group):
    """Every command's errors print as ``error: ...`` (click's own say ``Error:``), and Ctrl-C
    exits 130 with what was done (an :class:`Interrupted` summary), never click's ``Aborted!``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FabricError as exc:
            _fail(exc)
        except Interrupted as exc:
            click.echo(f"interrupted: {exc.summary}", err=True)
            sys.exit(130)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except click.UsageError as exc:
            if exc.ctx is not None:
                hint = f"Try '{exc.ctx.command_path} {exc.ctx.help_option_names[0]}' for help."
                click.echo(f"{exc.ctx.get_usage()}\n{hint}\n", err=True)
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)


def _reachable(endpoint: str) -> None:
    """Fail fast with CONNECTION_FAILED when no node answers (at once when nothing listens; else
    within 5 s or --timeout), before a long-lived client starts."""
    with _admin(endpoint, 5000) as admin:
        admin.ping()


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [["-" if r.get(c, "") is None else str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _emit(data: Any, as_json: bool, human: Callable[[Any], str]) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True) if as_json else human(data))


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class Duration(click.ParamType):
    """A duration: 500ms, 3s, 1.5m, 2h, 30d; a bare number is milliseconds. Converts to int ms."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        unit = next((u for u in ("ms", "s", "m", "h", "d") if text.endswith(u)), "")
        number = text[: len(text) - len(unit)] if unit else text
        try:
            amount = float(number)
        except ValueError:
            self.fail(f"{value!r} is not a duration like 500ms, 3s, 5m, 2h or 30d", param, ctx)
        if amount < 0 or amount != amount:
            self.fail(f"{value!r} is negative", param, ctx)
        return round(amount * _UNITS_MS[unit or "ms"])


DURATION = Duration()

_ENDPOINT = click.option(
    "--endpoint",
    "-e",
    envvar="FABRIC_ENDPOINT",
    default="tcp://127.0.0.1:7420",
    show_default=True,
    callback=_endpoint,
    help="Node endpoint: tcp://HOST:PORT, fabric://HOST:PORT or ipc://PATH (env FABRIC_ENDPOINT).",
)


def _set_timeout(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
    if value is not None:
        ctx.meta["fabric.timeout_ms"] = value


_TIMEOUT = click.option(
    "--timeout",
    type=DURATION,
    expose_value=False,
    callback=_set_timeout,
    help="How long to wait for the node to answer (500ms, 3s; default 10s, ping and the check "
    "before send/recv 3-5s). Nothing listening at the endpoint fails at once.",
)


def ENDPOINT(f: Any) -> Any:
    """--endpoint and --timeout: where the node is and how long to wait for it."""
    return _ENDPOINT(_TIMEOUT(f))


def _admin(endpoint: str, timeout_ms: int = 10_000) -> Any:
    """An Admin for a command: ``timeout_ms`` unless --timeout says otherwise; a refused
    connection (nothing listens at the endpoint) fails at once with the endpoint tried."""
    from fabric.client import Admin

    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        timeout_ms = ctx.meta.get("fabric.timeout_ms", timeout_ms)
    return Admin(endpoint, timeout_ms=timeout_ms, fail_refused=True)
