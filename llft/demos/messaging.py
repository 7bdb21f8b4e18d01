"""`llft demo messaging`: the messaging protocol alone, under loss, with a timeline.

Scenario: two groups of three replicas each, as
separate OS processes on loopback multicast. Group A's application streams a seeded byte
stream to group B over one LLFT connection while every replica's transport drops
`--drop` of the datagrams it receives. The timeline shows each receiver's progress; at
the end every replica of B must hold the same bytes as A's application produced
(SHA-256 compared), with no gap and no duplicate.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time

from llft.runtime import keys
from llft.tools.procs import ProcGroup, random_group_addresses
from llft.tools.streamdemo import stream_bytes


def run(args) -> int:
    total = int(args.mb * 1e6)
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.2f}s] {text}", flush=True)

    with tempfile.TemporaryDirectory(prefix="llft-demo-") as tmp:
        key_path = os.path.join(tmp, "cluster.key")
        keys.write_key(key_path)
        addresses = random_group_addresses(["A", "B"])
        common = ["--key", key_path, "--addresses", addresses, "--drop", str(args.drop),
                  "--seed", str(args.seed)]
        pg = ProcGroup(tmp)
        try:
            receivers = [11, 12, 13]
            for m in receivers:
                pg.python(f"B{m}", "llft.tools.streamdemo", "--group", "B", "--me", str(m),
                          "--members", "11,12,13", "--expect-bytes", str(total),
                          "--progress-s", "0.5", *common)
            if not pg.wait(lambda: all(pg.procs[f"B{m}"].find("ready") for m in receivers), 30):
                print("demo: group B did not start", file=sys.stderr)
                return 1
            say(f"group B up: replicas 11 (primary), 12, 13 on {addresses.split(',')[1]}")
            for m in (1, 2, 3):
                pg.python(f"A{m}", "llft.tools.streamdemo", "--group", "A", "--me", str(m),
                          "--members", "1,2,3", "--send-to", "B", "--send-bytes", str(total),
                          *common)
            say(f"group A up: replicas 1 (primary), 2, 3 stream {args.mb:g} MB to B, "
                f"{args.drop:.0%} of datagrams dropped at every receiver")
            seen, last_print = 0, 0.0
            deadline = time.monotonic() + 120 + total / 100_000

            def progressed():
                return (sum(len(pg.procs[f"B{m}"].events) for m in receivers) > seen
                        or all(pg.procs[f"B{m}"].find("received") for m in receivers))
            while not all(pg.procs[f"B{m}"].find("received") for m in receivers):
                if time.monotonic() > deadline or not pg.wait(progressed, 5):
                    say("stalled: not every replica of B received the stream")
                    return 1
                seen = sum(len(pg.procs[f"B{m}"].events) for m in receivers)
                if time.monotonic() - last_print < 0.45:
                    continue
                last_print = time.monotonic()
                latest = [next((e["bytes"] for e in reversed(pg.procs[f"B{m}"].events)
                                if "bytes" in e), 0) for m in receivers]
                say("received  " + "  ".join(f"B{m}: {b / 1e6:6.2f} MB"
                                             for m, b in zip(receivers, latest)))
            h = hashlib.sha256()
            for chunk in stream_bytes(args.seed, total):
                h.update(chunk)
            want = h.hexdigest()
            ok = True
            for m in receivers:
                ev = pg.procs[f"B{m}"].find("received")
                good = ev["sha256"] == want and not ev["errors"] and ev["bytes"] == total
                ok &= good
                say(f"B{m}: {ev['bytes']} bytes, sha256 {ev['sha256'][:16]}… "
                    f"{'matches the sender' if good else 'MISMATCH'}; "
                    f"{total / max(ev['active_seconds'], 1e-9) / 1e6:.2f} MB/s")
        finally:
            pg.stop_all()
        drops = sum(p.find("stats")["transport"].get("dropped_recv", 0)
                    for p in pg.procs.values() if p.find("stats"))
        say(f"{drops} datagrams were dropped on purpose; lost bytes: 0, duplicated bytes: 0"
            if ok else "FAILED")
        return 0 if ok else 1
