"""How a fabric process writes its log: human lines (the default) or JSON lines.

``[node] log_format = "json"`` (or ``fabric up --log-format json``) writes one JSON object per line
to stderr: ``ts`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``node``, ``msg``, and
``exc`` with the traceback when there is one. Fields a caller passes with ``extra={...}`` (for
example ``principal`` on authentication events, once those exist) are added as they are, so a log
shipper can index them without parsing sentences."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# the attributes every LogRecord has: anything else on a record came from ``extra``
_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "node": self.node,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value if isinstance(value, str | int | float | bool | None) else repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, log_format: str, node: str, *, text_format: str | None = None) -> None:
    """Set up the root logger once per process (stderr)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter(node))
    else:
        handler.setFormatter(logging.Formatter(text_format or "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
