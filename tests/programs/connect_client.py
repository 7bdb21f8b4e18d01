"""A Spark Connect client (pyspark's thin client): a groupBy over a range, printed sorted.

    python connect_client.py PORT [--channel]

With --channel it also says which gRPC channel class pyspark got (under llft: the
relay's, so grpcio's C-core runs no thread in this process).
"""
import sys

from pyspark.sql import SparkSession

spark = SparkSession.builder.remote(f"sc://127.0.0.1:{sys.argv[1]}").getOrCreate()
df = spark.range(1000).selectExpr("id % 7 AS k", "id").groupBy("k").count().orderBy("k")
print(sorted(tuple(r) for r in df.collect()))
if "--channel" in sys.argv:
    print(f"channel {type(spark.client._channel).__name__}")
spark.stop()
