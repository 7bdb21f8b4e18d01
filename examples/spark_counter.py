"""The counter service as a PySpark driver: every request runs a tiny Spark job.

An ordinary PySpark driver program: nothing here knows about llft. It runs the same
plainly and replicated under `llft run`. It is what a user's "small service in front of
Spark" looks like, full of what replication must make deterministic:

- one thread per connection and a lock around the driver's state;
- every INCR runs a Spark SQL job over a DataFrame built from Python data (the key's and
  the global count), under the lock: the new counts come out of Spark;
- a ticker thread wakes every TICK_S (time.monotonic()), takes the same lock and runs a
  job with a Python function seeded by `random` (so Spark starts its Python workers):
  an RDD lambda in a local session, a Python UDF against a Spark Connect server; its
  result is mixed into every later reply;
- time.time() and random in every reply.

    python examples/spark_counter.py [PORT] [--master local[1]]     (default 9000)
    python examples/spark_counter.py [PORT] --remote sc://HOST:PORT

Two ways to reach Spark (README, "which mode when"): its own local session (classic;
replicated, every replica runs its own JVM and every job), or `--remote`, a thin client
of a shared Spark Connect server (replicated, the replicas share that server and only
the primary's calls reach it; the Python UDF runs in the server's Python workers).

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
from pyspark.sql import functions as F
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


def ticker(spark: SparkSession, remote: bool) -> None:
    """TICK_S after the last: a Spark job with Python workers, under the driver's lock."""
    while True:
        time.sleep(TICK_S)
        with lock:
            seed = random.getrandbits(20) | 1
            if remote:                           # Connect has no RDDs: a Python UDF
                f = F.udf(lambda x: (x * seed) % 1000003, "long")
                state["tick"] = spark.range(64).select(f("id").alias("v")) \
                    .agg(F.sum("v").alias("s")).first()["s"]
            else:
                state["tick"] = spark.sparkContext.parallelize(range(64), 1).map(
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
    p.add_argument("--remote", help="a Spark Connect server (sc://host:port) instead of a "
                   "local session")
    a = p.parse_args(argv)
    if a.remote:
        spark = SparkSession.builder.remote(a.remote).getOrCreate()
    else:
        spark = (SparkSession.builder.master(a.master).appName("spark-counter")
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "1")
                 .config("spark.default.parallelism", "1")
                 .config("spark.ui.showConsoleProgress", "false")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    threading.Thread(target=ticker, args=(spark, bool(a.remote)), name="ticker",
                     daemon=True).start()
    kv_counter.serve_forever(a.port, lambda line: handle(spark, line), name="spark_counter")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
