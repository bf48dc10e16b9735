"""The benchmarks behind ``fabric bench`` (:mod:`fabric.bench.single`: one node),
``fabric bench-cluster`` (:mod:`fabric.bench.cluster`: routers against leaders) and
``fabric bench-direct`` (:mod:`fabric.bench.direct`: a direct queue against raw pyzmq)."""
