"""``fabric usage report``: the usage pipeline's Spark job (fabric.spark.usage) from the shell."""

from __future__ import annotations

import json
import time

import click

from fabric.cli.common import DURATION, ENDPOINT, JSON, _Group, _table
from fabric.cli.progress import Progress


@click.group(cls=_Group)
def usage() -> None:
    """Usage records (__usage): reports for audit and billing."""


@usage.command("report")
@ENDPOINT
@click.option("--since", "since_ms", type=DURATION, default="24h", show_default=True, help="How far back.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Where the report goes.")
@click.option("--top", "top_n", type=click.IntRange(min=1), default=10, show_default=True, help="Rows printed.")
@JSON
def usage_report(endpoint: str, since_ms: int, out_dir: str, top_n: int, as_json: bool) -> None:
    """Sum __usage per principal, queue and hour with Spark: Parquet, CSV and a PNG chart in --out
    (a progress line on stderr while Spark runs, when it is a terminal and without --json)."""
    try:
        from fabric.spark.session import local_session
        from fabric.spark.usage import report
    except ImportError as exc:
        raise click.ClickException(
            f"the usage report runs on Spark: pip install 'fabric-mq[spark]' (and Java 17) ({exc})"
        ) from None
    with Progress(as_json) as progress:
        progress.update("usage report: starting Spark")
        spark = local_session("fabric-usage-report")
        try:
            progress.update(
                f"usage report: reading __usage and summing it per principal, queue and hour into {out_dir}"
            )
            rows = report(spark, endpoint, int(time.time() * 1000) - since_ms, out_dir)
        finally:
            progress.update("usage report: stopping Spark")
            spark.stop()
    shown = [
        {
            "PRINCIPAL": r["principal"],
            "QUEUE": r["queue"],
            "HOUR": r["hour"].strftime("%Y-%m-%d %H:00") if r["hour"] else "-",
            "IN_MSGS": r["produced_messages"],
            "IN_BYTES": r["produced_bytes"],
            "OUT_MSGS": r["consumed_messages"],
            "OUT_BYTES": r["consumed_bytes"],
        }
        for r in rows[:top_n]
    ]
    if as_json:
        document = {
            "out": out_dir,
            "files": ["usage.parquet", "usage.csv", "busiest_queues.png"],
            "rows": len(rows),
            "top": [{k.lower(): v for k, v in r.items()} for r in shown],
        }
        click.echo(json.dumps(document, indent=2, sort_keys=True, default=str))
        return
    if shown:
        click.echo(_table(shown, list(shown[0])))
    else:
        click.echo("no usage records in that period")
    click.echo(f"{len(rows)} row(s); report in {out_dir}: usage.parquet/, usage.csv/, busiest_queues.png")
