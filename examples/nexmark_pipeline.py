"""A streaming pipeline driver in the spirit of the Nexmark benchmark, on PySpark.

An ordinary PySpark driver program: nothing here knows about llft. It runs the same
plainly and replicated under `llft run` (each replica then starts its own local Spark
session; llft replicates this Python program, never the JVM).

    python examples/nexmark_pipeline.py [--port 9400] [--window-ms 1000]
        [--batch-events 500] [--batch-ms 250] [--checkpoint DIR] [--remote sc://HOST:PORT]

`--remote`: the same driver as a Spark Connect thin client of a shared server (under
`llft run` the replicas then share that one Spark) instead of its own local session.

It listens on PORT. A client that sends `SOURCE\\n` is the event stream (the driver
answers `FROM <offset>\\n`, then reads events: see llft/spark/nexmark.py); a client that sends
`SINK\\n` receives the results. Either may connect first; results wait for the sink.

Processing:
- micro-batches close by count (`--batch-events`) or by time (`--batch-ms`, measured
  with time.monotonic()), whichever comes first;
- every batch runs Spark SQL: the batch's auctions and persons are added to running
  state tables kept in Spark (`auctions_all`, `persons_all`), and its bids are joined
  with them (bid -> auction -> seller) and appended to the open windows' bids;
- event-time windows of `--window-ms` close when a later event arrives (the stream is
  in event-time order); for each closed window the driver queries Spark for the highest
  bids per auction, the running bid counts per category (state across all windows) and
  the bid volume per seller's state (the join), and writes one JSON line to the sink.

The results depend only on the input events, never on where batch boundaries fell, so
two runs on the same input produce the same bytes.

`--checkpoint DIR`: after every batch, the state tables and the input offset are saved
(parquet + an atomically replaced JSON pointer); a driver restarted on the same DIR
resumes from there and asks the source for the events after the checkpoint. This is how
Spark users protect a driver today (with a supervisor restarting it); results emitted
after the last checkpoint are emitted again after a restart (at-least-once).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import socket
import sys
import threading
import time

from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

AUCTION = StructType([StructField(n, LongType()) for n in
                      ("seq", "ts", "id", "seller", "category", "initial")])
PERSON = StructType([StructField("seq", LongType()), StructField("ts", LongType()),
                     StructField("id", LongType()), StructField("name", StringType()),
                     StructField("city", StringType()), StructField("state", StringType())])
BID = StructType([StructField(n, LongType()) for n in
                  ("seq", "ts", "auction", "bidder", "price", "w")])
PENDING = StructType(BID.fields + [StructField("category", LongType()),
                                   StructField("seller_state", StringType())])
CATS = StructType([StructField("category", LongType()), StructField("bids", LongType())])
END = object()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=9400)
    p.add_argument("--window-ms", type=int, default=1000)
    p.add_argument("--batch-events", type=int, default=500)
    p.add_argument("--batch-ms", type=int, default=250)
    p.add_argument("--checkpoint", help="directory for the state checkpoint (restart recovery)")
    p.add_argument("--master", default="local[1]")
    p.add_argument("--remote", help="a Spark Connect server (sc://host:port) instead of a "
                   "local session")
    return p.parse_args(argv)


class Connections:
    """Accepts SOURCE and SINK clients. Events go to `events` (a queue); result lines
    wait in `outbox` until a sink is connected."""

    def __init__(self, port: int, start_offset: int):
        self.events: queue.Queue = queue.Queue(maxsize=20000)
        self.start_offset = start_offset
        self.lock = threading.Lock()
        self.sink: socket.socket | None = None
        self.outbox: list[bytes] = []
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("0.0.0.0", port))
        self.listener.listen(8)
        threading.Thread(target=self._accept_loop, name="accept", daemon=True).start()

    def _accept_loop(self):
        while True:
            conn, _ = self.listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            f = conn.makefile("rb")
            hello = f.readline()
            if hello == b"SOURCE\n":
                threading.Thread(target=self._read_source, args=(conn, f), name="source",
                                 daemon=True).start()
            elif hello == b"SINK\n":
                with self.lock:
                    self.sink = conn
                    self._flush()
            else:
                print(f"pipeline: unknown client hello {hello[:40]!r}", file=sys.stderr)
                conn.close()

    def _read_source(self, conn, f):
        # The next needed offset: what the last (re)start resumed from plus what was read.
        with self.lock:
            offset = self.start_offset
        conn.sendall(b"FROM %d\n" % offset)
        for line in f:
            if line == b"END\n":
                self.events.put(END)
                return
            fields = line.rstrip(b"\n").decode().split(",")
            seq = int(fields[1])
            with self.lock:
                if seq < self.start_offset:  # already read on a previous connection
                    continue
                self.start_offset = seq + 1
            self.events.put(fields)
        print("pipeline: source disconnected", file=sys.stderr)

    def emit(self, line: bytes):
        with self.lock:
            self.outbox.append(line)
            if self.sink is not None:
                self._flush()

    def _flush(self):
        try:
            self.sink.sendall(b"".join(self.outbox))
            self.outbox.clear()
        except OSError:
            self.sink = None  # keep the lines for the next sink


class Pipeline:
    def __init__(self, spark: SparkSession, window_ms: int, checkpoint: str | None):
        self.spark, self.window_ms, self.checkpoint = spark, window_ms, checkpoint
        self.next_offset = 0          # next input event to read
        self.next_window = 0          # lowest window not yet emitted
        self.window_first: dict[int, int] = {}   # window -> first / last event seq seen
        self.window_last: dict[int, int] = {}
        self.events_total = 0
        self.batches = 0
        self.auctions = self._checkpointed(spark.createDataFrame([], AUCTION))
        self.persons = self._checkpointed(spark.createDataFrame([], PERSON))
        self.pending = self._checkpointed(spark.createDataFrame([], PENDING))
        self.categories = self._checkpointed(spark.createDataFrame([], CATS))
        if checkpoint:
            self._restore()

    @staticmethod
    def _checkpointed(df):
        # cut the lineage each batch: the state tables grow by union
        return df.localCheckpoint(eager=True)

    # ---- one micro-batch --------------------------------------------------------------
    def process(self, batch: list[list[str]]) -> list[bytes]:
        spark, wms = self.spark, self.window_ms
        auctions, persons, bids = [], [], []
        for f in batch:
            seq, ts = int(f[1]), int(f[2])
            w = ts // wms
            self.window_first.setdefault(w, seq)
            self.window_last[w] = seq
            if f[0] == "A":
                auctions.append((seq, ts, int(f[3]), int(f[4]), int(f[5]), int(f[6])))
            elif f[0] == "P":
                persons.append((seq, ts, int(f[3]), f[4], f[5], f[6]))
            else:
                bids.append((seq, ts, int(f[3]), int(f[4]), int(f[5]), w))
        self.events_total += len(batch)
        self.next_offset = int(batch[-1][1]) + 1
        if auctions:
            self.auctions = self._checkpointed(
                self.auctions.unionAll(spark.createDataFrame(auctions, AUCTION)))
        if persons:
            self.persons = self._checkpointed(
                self.persons.unionAll(spark.createDataFrame(persons, PERSON)))
        if bids:
            spark.createDataFrame(bids, BID).createOrReplaceTempView("batch_bids")
            self.auctions.createOrReplaceTempView("auctions_all")
            self.persons.createOrReplaceTempView("persons_all")
            enriched = spark.sql("""
                SELECT b.*, a.category, p.state AS seller_state
                FROM batch_bids b
                JOIN auctions_all a ON b.auction = a.id
                JOIN persons_all p ON a.seller = p.id""")
            self.pending = self._checkpointed(self.pending.unionAll(enriched))
        self.batches += 1
        # windows strictly before the newest event's window are complete
        newest = int(batch[-1][2]) // wms
        return [self._close(w) for w in range(self.next_window, newest)]

    def finish(self) -> list[bytes]:
        last = max(self.window_last) + 1 if self.window_last else self.next_window
        out = [self._close(w) for w in range(self.next_window, last)]
        end = {"end": True, "events": self.events_total, "windows": self.next_window}
        return out + [json.dumps(end, sort_keys=True, separators=(",", ":")).encode() + b"\n"]

    def _close(self, w: int) -> bytes:
        spark = self.spark
        self.pending.createOrReplaceTempView("pending")
        self.categories.createOrReplaceTempView("categories")
        top = spark.sql(f"""
            SELECT auction, max(price) AS best, count(*) AS n FROM pending WHERE w = {w}
            GROUP BY auction ORDER BY best DESC, auction LIMIT 5""").collect()
        self.categories = self._checkpointed(spark.sql(f"""
            SELECT category, sum(bids) AS bids FROM (
                SELECT category, bids FROM categories
                UNION ALL
                SELECT category, count(*) AS bids FROM pending WHERE w = {w} GROUP BY category)
            GROUP BY category"""))
        cats = self.categories.orderBy("category").collect()
        states = spark.sql(f"""
            SELECT seller_state, sum(price) AS volume, count(*) AS n FROM pending WHERE w = {w}
            GROUP BY seller_state ORDER BY volume DESC, seller_state LIMIT 5""").collect()
        nbids = sum(r["n"] for r in spark.sql(
            f"SELECT count(*) AS n FROM pending WHERE w = {w}").collect())
        self.pending = self._checkpointed(self.pending.where(f"w > {w}"))
        result = {
            "w": w,
            "events": [self.window_first.pop(w, -1), self.window_last.pop(w, -1)],
            "bids": nbids,
            "top_bids": [[r["auction"], r["best"], r["n"]] for r in top],
            "bids_per_category": [[r["category"], r["bids"]] for r in cats],
            "volume_per_seller_state": [[r["seller_state"], r["volume"], r["n"]] for r in states],
        }
        self.next_window = w + 1
        return json.dumps(result, sort_keys=True, separators=(",", ":")).encode() + b"\n"

    # ---- checkpoint (only with --checkpoint) -------------------------------------------
    def save(self) -> None:
        d = os.path.join(self.checkpoint, f"batch-{self.batches}")
        for name in ("auctions", "persons", "pending", "categories"):
            getattr(self, name).write.mode("overwrite").parquet(os.path.join(d, name))
        meta = {"batch": self.batches, "next_offset": self.next_offset,
                "next_window": self.next_window, "events_total": self.events_total,
                "window_first": self.window_first, "window_last": self.window_last}
        tmp = os.path.join(self.checkpoint, "LATEST.tmp")
        with open(tmp, "w") as f:
            json.dump({"dir": d, **meta}, f)
            f.flush()
            os.fsync(f.fileno())
        old = self._latest()
        os.replace(tmp, os.path.join(self.checkpoint, "LATEST"))
        if old and old["dir"] != d:
            shutil.rmtree(old["dir"], ignore_errors=True)

    def _latest(self) -> dict | None:
        try:
            with open(os.path.join(self.checkpoint, "LATEST")) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _restore(self) -> None:
        os.makedirs(self.checkpoint, exist_ok=True)
        meta = self._latest()
        if meta is None:
            return
        rd = self.spark.read
        self.auctions = self._checkpointed(rd.schema(AUCTION).parquet(os.path.join(meta["dir"], "auctions")))
        self.persons = self._checkpointed(rd.schema(PERSON).parquet(os.path.join(meta["dir"], "persons")))
        self.pending = self._checkpointed(rd.schema(PENDING).parquet(os.path.join(meta["dir"], "pending")))
        self.categories = self._checkpointed(rd.schema(CATS).parquet(os.path.join(meta["dir"], "categories")))
        self.batches, self.next_offset = meta["batch"], meta["next_offset"]
        self.next_window, self.events_total = meta["next_window"], meta["events_total"]
        self.window_first = {int(k): v for k, v in meta["window_first"].items()}
        self.window_last = {int(k): v for k, v in meta["window_last"].items()}
        print(f"pipeline: restored batch {self.batches}, resuming at event {self.next_offset}",
              file=sys.stderr)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.remote:
        spark = SparkSession.builder.remote(a.remote).getOrCreate()
        for k, v in (("spark.sql.shuffle.partitions", "1"), ("spark.sql.adaptive.enabled", "false")):
            spark.conf.set(k, v)
    else:
        spark = (SparkSession.builder.master(a.master).appName("nexmark-pipeline")
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "1")
                 .config("spark.default.parallelism", "1")
                 .config("spark.sql.adaptive.enabled", "false")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    pipe = Pipeline(spark, a.window_ms, a.checkpoint)
    conns = Connections(a.port, pipe.next_offset)
    print(f"pipeline: listening on {a.port}", file=sys.stderr, flush=True)
    done = False
    while not done:
        batch: list[list[str]] = []
        first = conns.events.get()           # a batch starts with its first event
        if first is END:
            done = True
        else:
            batch.append(first)
            deadline = time.monotonic() + a.batch_ms / 1000
            while len(batch) < a.batch_events:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    ev = conns.events.get(timeout=left)
                except queue.Empty:
                    break
                if ev is END:
                    done = True
                    break
                batch.append(ev)
        out = pipe.process(batch) if batch else []
        if done:
            out += pipe.finish()
        for line in out:
            conns.emit(line)
        if a.checkpoint and batch:
            pipe.save()
    print(f"pipeline: end of stream after {pipe.events_total} events, {pipe.batches} batches",
          file=sys.stderr, flush=True)
    # stay up (a replicated service does not exit on its own); the operator stops it
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
