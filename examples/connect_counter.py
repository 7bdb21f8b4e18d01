"""The counter service as a Spark Connect driver: every request runs a Spark job on a
shared Spark Connect server.

The thin-client twin of examples/spark_counter.py: an ordinary program that knows
nothing about llft. Under `llft run` its replicas share ONE Spark (the Connect server,
started with `llft spark-connect start`): the primary's gRPC calls are made by its
agent's relay and reach the backups as order information, so a backup runs no Spark job
and needs no JVM of its own; a promoted backup continues the same Spark Connect session.

- one thread per connection and a lock around the driver's state;
- every INCR runs a Spark SQL job on the server over a DataFrame built from Python data
  (the driver's current counts), under the lock;
- a ticker thread wakes every TICK_S (time.monotonic()), takes the same lock and runs
  an aggregation job seeded by `random`; its result is mixed into every later reply;
- time.time() and random in every reply.

    python examples/connect_counter.py [PORT] [--remote sc://127.0.0.1:15002]

The kv_counter protocol (examples/kv_counter.py), INCR and STATS:

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_counter  # noqa: E402  (the example next to this one: its connection loop)

TICK_S = 1.0

lock = threading.Lock()
counts: dict[str, int] = {}
state = {"global": 0, "tick": 0, "ticks": 0, "jobs": 0}


def incr(spark: SparkSession, key: str) -> str:
    with lock:
        # the new counts come out of Spark, computed from the driver's current ones
        row = spark.createDataFrame([(counts.get(key, 0), state["global"])], "n long, g long") \
            .selectExpr("n + 1 AS n", "g + 1 AS g").first()
        state["jobs"] += 1
        counts[key], state["global"] = row["n"], row["g"]
        mix = (random.getrandbits(32) ^ state["tick"]) & 0xFFFFFFFF
        return f"OK {key} {row['n']} {row['g']} {time.time()!r} {mix:08x}"


def ticker(spark: SparkSession) -> None:
    """TICK_S after the last: an aggregation on the server, under the driver's lock."""
    while True:
        time.sleep(TICK_S)
        with lock:
            seed = random.getrandbits(20) | 1
            state["tick"] = spark.range(64).selectExpr(
                f"sum((id * {seed}) % 1000003) AS s").first()["s"]
            state["ticks"] += 1
            state["jobs"] += 1


def handle(spark: SparkSession, line: str) -> str:
    parts = line.split(" ")
    if parts[0].upper() == "INCR" and len(parts) == 2 and parts[1]:
        return incr(spark, parts[1])
    if parts[0].upper() == "STATS" and len(parts) == 1:
        with lock:
            return f"OK {state['global']} {len(counts)} {state['ticks']} {state['jobs']}"
    return f"ERR unknown request {line[:80]!r} (INCR key | STATS)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("port", type=int, nargs="?", default=9000)
    p.add_argument("--remote", default="sc://127.0.0.1:15002")
    a = p.parse_args(argv)
    spark = SparkSession.builder.remote(a.remote).getOrCreate()
    threading.Thread(target=ticker, args=(spark,), name="ticker", daemon=True).start()
    kv_counter.serve_forever(a.port, lambda line: handle(spark, line), name="connect_counter")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
