"""The usage report as a standalone Spark job: python spark/usage_report.py [ENDPOINT] [HOURS] [OUT].

The same job as `fabric usage report` (fabric.spark.usage.report, importable by Spark's workers
from the installed package): __usage summed per principal, queue and hour into Parquet, CSV and a
PNG chart of the busiest queues."""

from __future__ import annotations

import sys
import time

from fabric.spark.session import local_session
from fabric.spark.usage import report


def main() -> None:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:7420"
    hours = float(sys.argv[2]) if len(sys.argv) > 2 else 24
    out = sys.argv[3] if len(sys.argv) > 3 else "usage-report"
    spark = local_session("fabric-usage-report")
    try:
        rows = report(spark, endpoint, int((time.time() - hours * 3600) * 1000), out)
    finally:
        spark.stop()
    for r in rows[:10]:
        print(
            r["principal"],
            r["queue"],
            r["hour"],
            r["produced_messages"],
            r["produced_bytes"],
            r["consumed_messages"],
            r["consumed_bytes"],
        )
    print(f"{len(rows)} row(s) in {out}")


if __name__ == "__main__":
    main()
