"""A local PySpark session under `llft record` and `llft replay`: the driver's Python side
replays byte for byte while its JVM runs as a private companion of the replica."""
from __future__ import annotations

import sys

from rr_helpers import record, replay

SPARK_PROGRAM = """
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").appName("llft-rr")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .getOrCreate())
df = spark.range(100).selectExpr("id as x", "id * id as y").filter("x % 2 = 0")
print("even rows", df.count())
print("schema", df.schema.simpleString())
local = spark.createDataFrame([(i, str(i) * 2) for i in range(10)], ["k", "v"])
print("collected", sorted(tuple(r) for r in local.filter("k > 6").collect()))
spark.stop()
print("stopped")
"""


def test_pyspark_local_session_record_replay(tmp_path):
    """SparkSession start, a tiny query, stop: the JVM runs as a private companion
    (never determinized, the shim strips itself from its environment); the Python side
    replays with identical output.

    PySpark's default py4j ClientServer has a FinalizerWorker thread that polls a
    deque every second without a lock (a race only the GIL arbitrates): the sleep
    barrier makes its replay follow the primary, and the worker, asleep when the
    primary exited, is parked past the end of the trace. collect() reads the result
    over a private socket whose chunking steers CPython's BufferedReader lock fast
    path: read sizes are replayed as hints. The accumulator server's select loop is
    ordered, with the primary's "ready" made true locally before it is returned.
    """
    src = tmp_path / "spark_prog.py"
    src.write_text(SPARK_PROGRAM)
    work = tmp_path / "w"
    work.mkdir()
    trace = str(tmp_path / "trace")
    py = sys.executable  # the venv's interpreter has pyspark
    out, _ = record([py, str(src)], trace, str(work), timeout=300)
    assert b"even rows 50" in out
    p, _ = replay(trace, str(work), stall_ms=60000, timeout=300)
    assert p.stdout == out
