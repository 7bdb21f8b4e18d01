"""The counter service as a PySpark driver: every request runs a tiny Spark job.

An ordinary PySpark driver program: nothing here knows about llft. It runs the same
plainly and replicated under `llft run` (each replica then starts its own local Spark
session; llft replicates this Python program, never the JVM). It is what a user's
"small service in front of Spark" looks like, full of what replication must make
deterministic:

- one thread per connection and a lock around the driver's state;
- every INCR runs a Spark SQL job (in the JVM) that computes the key's and the global
  count from the driver's current ones, under the lock;
- a ticker thread wakes every TICK_S (time.monotonic()), takes the same lock and runs an
  RDD job with a Python lambda (so the JVM starts PySpark's Python worker daemon),
  seeded by `random`; its result is mixed into every later reply;
- time.time() and random in every reply.

    python examples/spark_counter.py [PORT] [--master local[1]]     (default 9000)

The kv_counter protocol (examples/kv_counter.py), INCR only:

    INCR <key>   -> OK <key> <key_count> <global_count> <time.time()!r> <8 hex digits>
    STATS        -> OK <global_count> <keys> <ticks> <spark_jobs>
    anything else -> ERR ...
"""
import argparse
import os
import random
import sys
import threading
import time

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StructField, StructType

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_counter  # noqa: E402  (the example next to this one: its connection loop)

TICK_S = 1.0
COUNTS = StructType([StructField("n", LongType()), StructField("g", LongType())])

lock = threading.Lock()
counts: dict[str, int] = {}
state = {"global": 0, "tick": 0, "ticks": 0, "jobs": 0}


def incr(spark: SparkSession, key: str) -> str:
    with lock:
        # the new counts come out of Spark (a one-row SQL job), not out of Python; the
        # counts are the job's data, not literals of its plan, so that Spark generates
        # and compiles the plan's code once, not once per request
        row = spark.createDataFrame([(counts.get(key, 0), state["global"])], COUNTS) \
            .selectExpr("n + 1 AS n", "g + 1 AS g").first()
        state["jobs"] += 1
        counts[key], state["global"] = row["n"], row["g"]
        mix = (random.getrandbits(32) ^ state["tick"]) & 0xFFFFFFFF
        return f"OK {key} {row['n']} {row['g']} {time.time()!r} {mix:08x}"


def ticker(spark: SparkSession) -> None:
    """TICK_S after the last: a Spark job with Python workers, under the driver's lock."""
    sc = spark.sparkContext
    while True:
        time.sleep(TICK_S)
        with lock:
            seed = random.getrandbits(20) | 1
            state["tick"] = sc.parallelize(range(64), 1).map(
                lambda x: (x * seed) % 1000003).sum()
            state["ticks"] += 1
            state["jobs"] += 1


def handle(spark: SparkSession, line: str) -> str:
    parts = line.split(" ")
    if parts[0].upper() == "INCR" and len(parts) == 2 and parts[1]:
        return incr(spark, parts[1])
    if parts[0].upper() == "STATS" and len(parts) == 1:
        with lock:
            return (f"OK {state['global']} {len(counts)} {state['ticks']} {state['jobs']}")
    return f"ERR unknown request {line[:80]!r} (INCR key | STATS)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("port", type=int, nargs="?", default=9000)
    p.add_argument("--master", default="local[1]")
    a = p.parse_args(argv)
    spark = (SparkSession.builder.master(a.master).appName("spark-counter")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "1")
             .config("spark.default.parallelism", "1")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    threading.Thread(target=ticker, args=(spark,), name="ticker", daemon=True).start()
    kv_counter.serve_forever(a.port, lambda line: handle(spark, line), name="spark_counter")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
