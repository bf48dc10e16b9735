"""The fabric adapter with fsync every 100 ms: acks after the write, not after fdatasync."""

from tools.mqbench_fabric import FabricAdapter

ADAPTER = FabricAdapter("interval")
