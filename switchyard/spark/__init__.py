"""The PySpark pipeline: publish requests in bulk (calls to worker pools, or delay-scheduled).

``rows``, ``calls`` and ``schedule`` are plain Python (they run inside Spark tasks); only ``job``
imports pyspark (requirements-spark.txt), so the rest of Switchyard never needs it.
"""
