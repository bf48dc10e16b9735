"""The fabric adapter with clients on the stream transport (fabric://), fsync always."""

from tools.mqbench_fabric import FabricAdapter

ADAPTER = FabricAdapter("always", transport="stream")
