"""The fabric adapter (ZeroMQ clients, fsync always) with a producer that calls ``send()`` once
per message in the throughput case (the others call ``send_many``)."""

from tools.mqbench_fabric import FabricAdapter

ADAPTER = FabricAdapter(per_message=True)
