"""A local SparkSession set up the way a single development machine needs it.

Spark binds to the machine's external interface unless told otherwise, and its Python workers
run ``python3`` from PATH (which may lack fabric) unless ``PYSPARK_PYTHON`` names an interpreter.
:func:`local_session` pins both to this process (loopback, ``sys.executable``), keeps the logs
quiet and the shuffle small, and registers the ``fabric`` data source.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(
    app_name: str = "fabric",
    *,
    cores: int | None = None,
    max_failures: int = 4,
    shuffle_partitions: int = 4,
    log_level: str = "ERROR",
    conf: dict[str, str] | None = None,
) -> Any:
    """Start (or return the running) local SparkSession bound to 127.0.0.1 with the ``fabric``
    data source registered. ``cores``: ``local[n]`` (default: every core); ``max_failures``: attempts
    per task (a plain ``local[n]`` gives one, so a node restart under a task would fail the query)."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from fabric.spark.source import FabricDataSource

    builder = (
        SparkSession.builder.appName(app_name)
        .master(f"local[{cores or '*'},{max_failures}]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.streaming.stateStore.stateSchemaCheck", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.speculation", "false")
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    spark.dataSource.register(FabricDataSource)
    return spark
