"""fabric in Spark: the ``fabric`` PySpark data source (optional extra: ``pip install 'fabric-mq[spark]'``).

``fabric.spark.source.FabricDataSource`` reads queues as batches and streams and
``fabric.spark.sink`` writes them, each row stored once; ``fabric.spark.session.local_session()``
starts a local SparkSession with the source registered. See docs/spark.md.
"""
