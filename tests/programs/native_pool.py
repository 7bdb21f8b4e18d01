"""A native thread pool the interpreter does not run: pyarrow's CPU pool (C++ std::thread
workers, started by the library) sorting, grouping and summing a table built from
recorded randomness, plus jemalloc's background thread. Prints order-independent results
(sums, a sorted head, the pool's size) and the wall clock: a replay prints the same.

    python native_pool.py
"""
import os
import random
import time

import pyarrow as pa
import pyarrow.compute as pc

n = 200_000
xs = [random.random() for _ in range(n)]
t = pa.table({"x": pa.array(xs), "k": pa.array([i % 97 for i in range(n)])})
for _ in range(3):
    g = t.group_by("k").aggregate([("x", "sum"), ("x", "count")]).sort_by("k")
    head = pc.sort_indices(t["x"]).to_pylist()[:3]
print(f"pool {pa.cpu_count()} threads {len(os.listdir('/proc/self/task'))}")
print(f"sum {round(sum(g['x_sum'].to_pylist()), 6)} count {sum(g['x_count'].to_pylist())}")
print(f"smallest {head}")
print(f"now {time.time()!r}")
