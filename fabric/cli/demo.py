"""`fabric demo`: the first thing a new user runs (the steps are in :mod:`fabric.demo`)."""

from __future__ import annotations

import click


@click.command()
@click.option("--messages", "-n", type=click.IntRange(min=1), default=200_000, show_default=True)
@click.option("--size", type=click.IntRange(min=8), default=100, show_default=True, help="Message size in bytes.")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Keep the demo's data here (default: a temp dir).")
def demo(messages: int, size: int, data_dir: str | None) -> None:
    """Start an embedded node, send and receive messages through it, show the numbers, stop."""
    from fabric.demo import run_demo

    run_demo(messages=messages, size=size, data_dir=data_dir)
