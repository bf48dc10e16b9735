"""fabric: a distributed message queue on ZeroMQ.

from fabric import Admin, Producer, Consumer
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Admin", "Consumer", "FabricError", "Message", "Producer", "__version__"]


def __getattr__(name: str) -> Any:  # lazy, so `import fabric` stays light for the node process
    if name in ("Admin", "Consumer", "Producer", "Message", "ReceivedBatch", "RecordMetadata"):
        import fabric.client as client

        return getattr(client, name)
    if name == "FabricError":
        from fabric.errors import FabricError

        return FabricError
    raise AttributeError(name)
