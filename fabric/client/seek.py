"""Where ``Consumer.seek`` moves a position to: its arguments checked and read."""

from __future__ import annotations

from fabric.errors import BadParameter


def seek_target(to: int | str, timestamp_ms: int | None) -> int | str:
    """What LIST_OFFSETS is asked ``at`` (a timestamp, ``"earliest"`` or ``"latest"``), or -1
    when ``to`` is an offset already. Raises BadParameter for anything else."""
    if to == "timestamp":
        if timestamp_ms is None:
            raise BadParameter("seek(to='timestamp') needs timestamp_ms")
        at: int | str = timestamp_ms
    elif to in ("earliest", "latest"):
        at = to
    elif type(to) is int and to >= 0:
        at = -1
    else:
        raise BadParameter(f"seek to an offset, 'earliest', 'latest' or 'timestamp', not {to!r}")
    return at
