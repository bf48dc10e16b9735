"""The fabric adapter with clients on the stream transport (fabric://), fsync every 100 ms."""

from tools.mqbench_fabric import FabricAdapter

ADAPTER = FabricAdapter("interval", transport="stream")
