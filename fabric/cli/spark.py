"""`fabric spark ...`: the retention holds of Spark streaming queries (docs/spark.md)."""

from __future__ import annotations

import json

import click

from fabric.cli.common import ENDPOINT, JSON, YES, _admin, _emit, _Group, _table, confirm


@click.group(cls=_Group)
def spark() -> None:
    """Spark streaming queries registered with the node (their retention holds)."""


@spark.command("queries")
@ENDPOINT
@JSON
def spark_queries(endpoint: str, as_json: bool) -> None:
    """List the registered queries: queue, the offsets they hold from, records held."""
    from fabric.spark.queries import list_queries

    with _admin(endpoint) as admin:
        rows = list_queries(admin)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    shown = [{**r, "committed": json.dumps(r["committed"], separators=(",", ":"))} for r in rows]
    _emit(shown, False, lambda rs: _table(rs, ["query", "queue", "committed", "lag"]))


@spark.command("forget")
@click.argument("query")
@click.option("--queue", default=None, help="only this queue (default: every queue the query holds)")
@ENDPOINT
@YES
@JSON
def spark_forget(query: str, queue: str | None, endpoint: str, yes: bool, as_json: bool) -> None:
    """Remove QUERY's retention hold: retention may then delete what only it still needed."""
    from fabric.spark.queries import forget

    confirm(f"Remove the retention hold of Spark query {query}?", yes)
    with _admin(endpoint) as admin:
        queues = forget(admin, query, queue)
    if not queues:
        raise click.ClickException(f"no query {query!r} is registered")
    _emit({"query": query, "queues": queues}, as_json, lambda d: f"forgot query {query} on {', '.join(d['queues'])}")
