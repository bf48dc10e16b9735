"""One Prometheus endpoint per process (a node's ``[metrics] listen``, a router's ``metrics_listen``):
prometheus-client's HTTP server on its own thread, serving one collector plus the process metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.registry import Collector

from fabric.errors import ConfigError


class MetricsServer:
    def __init__(self, listen: str, collector: Collector) -> None:
        host, _, port = listen.rpartition(":")
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.registry.register(ProcessCollector(namespace="fabric", registry=None))
        try:
            self._server, self._thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot serve metrics on {listen}: {getattr(exc, 'strerror', None) or exc}") from None
        self.endpoint = f"http://{host or '127.0.0.1'}:{self._server.server_port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
