"""One member of a statically configured group that streams bytes over an LLFT connection.

Used by the multi-process messaging tests, `llft demo messaging` and `llft bench
messaging`: real OS processes, real loopback multicast, the real messaging core, wire
format and transport. Membership is static here (the view is given on the command line;
the membership protocol replaces that in `llft run`).

Every member of the sending group produces the same deterministic stream (seeded bytes):
the primary sends it, the backups log it (semi-active replication). Every member of the
receiving group checks that deliveries are contiguous by stream offset and prints the
SHA-256 of what it received. With --echo a member writes back what it receives (the
server of the latency benchmark). Output is JSON lines on stdout:

    {"event": "ready", ...}                      endpoint bound, view installed
    {"event": "received", "bytes": N, "sha256": H, "seconds": S (since start),
     "active_seconds": first to last delivery, "errors": [...]}
    {"event": "progress", "bytes": N, "t": S}      every --progress-s seconds
    {"event": "stats", ...}                      transport and core counters, at exit

Run `python -m llft.tools.streamdemo --help` for the options.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import signal
import sys
import time

from llft.runtime import keys
from llft.runtime.driver import Driver
from llft.protocol.messages import Role
from llft.protocol.messaging import Closed, Deliver, MessagingConfig, MessagingEndpoint
from llft.runtime.transport import Endpoint, Faults, GroupMap

CHUNK_BYTES = 64 << 10          # the sending application writes this much at a time
CONN_SEQ = 1


def stream_bytes(seed: int, total: int):
    """The deterministic stream every member of the sending group produces."""
    rng = random.Random(seed)
    left = total
    while left:
        n = min(CHUNK_BYTES, left)
        yield rng.randbytes(n)
        left -= n


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


async def main_async(args) -> int:
    key = keys.load_key(args.key)
    members = [(int(b), i + 1) for i, b in enumerate(args.members.split(","))]
    primary = members[0][0]
    cfg = MessagingConfig(max_payload_bytes=args.payload_bytes)
    core = MessagingEndpoint(args.group, args.me, cfg)
    faults = Faults(drop=args.drop, seed=args.me * 7919 + args.seed) if args.drop else None
    endpoint = Endpoint(key, args.group, lambda m: None, groups=GroupMap.parse(args.addresses),
                        birth_id=args.me, recv_faults=faults)
    digest = hashlib.sha256()
    state = {"bytes": 0, "errors": []}
    done = asyncio.Event()
    pending: list = []          # echo mode: (conn, data) delivered, not yet written back
    started = time.monotonic()

    def on_action(action) -> None:
        if isinstance(action, Deliver) and args.echo:
            # every member echoes (the primary sends, backups log): semi-active replication
            # Sending from inside the driver's pump is safe: the pump drains the
            # actions this produces in its next round.
            pending.append((action.conn, action.data))
            echo_pump()
            return
        if isinstance(action, Closed) and args.echo:
            pending.append((action.conn, action.abort))   # the end is echoed too, in order
            echo_pump()
            return
        if isinstance(action, Deliver):
            if action.offset != state["bytes"]:
                state["errors"].append(f"offset {action.offset} != expected {state['bytes']}")
            now = time.monotonic()
            state.setdefault("first", now)
            state["last"] = now
            digest.update(action.data)
            state["bytes"] += len(action.data)
            if state["bytes"] >= args.expect_bytes > 0:
                done.set()

    def echo_pump() -> None:
        # Write back what flow control admits now; echo_loop retries the rest.
        while pending:
            conn, data = pending[0]
            if isinstance(data, bool):
                core.close(conn, data, driver.clock_us())
                pending.pop(0)
                continue
            n = core.send(conn, data, driver.clock_us())
            if n < len(data):
                pending[0] = (conn, data[n:])
                return
            pending.pop(0)

    driver = Driver(endpoint, core, on_action=on_action)
    await endpoint.start()
    core.set_view(1, primary, members, args.me, now_us=driver.clock_us())
    driver.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    emit(event="ready", group=args.group, me=args.me, primary=primary == args.me)

    if args.send_to:
        conn = driver.call(core.open, args.send_to, CONN_SEQ, Role.CLIENT)
        for chunk in stream_bytes(args.seed, args.send_bytes):
            view = memoryview(chunk)
            while view:
                n = driver.call(core.send, conn, view, driver.clock_us())
                view = view[n:]
                if not n:
                    driver.progress.clear()
                    await driver.progress.wait()
        emit(event="sent", bytes=args.send_bytes, seconds=round(time.monotonic() - started, 3))

    if args.echo:
        async def echo_loop():
            while True:
                driver.progress.clear()
                await driver.progress.wait()
                if pending:
                    driver.call(echo_pump)
        echo_task = asyncio.ensure_future(echo_loop())

    async def report_progress():
        while True:
            await asyncio.sleep(args.progress_s)     # a reporting period, not a synchronisation
            emit(event="progress", bytes=state["bytes"], t=round(time.monotonic() - started, 3))
    reporter = asyncio.ensure_future(report_progress()) if args.progress_s > 0 else None

    if args.expect_bytes:
        waiter = asyncio.ensure_future(done.wait())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        emit(event="received", bytes=state["bytes"], sha256=digest.hexdigest(),
             seconds=round(time.monotonic() - started, 3),
             active_seconds=state.get("last", 0) - state.get("first", 0),
             errors=state["errors"][:10])
    await stop.wait()
    if reporter is not None:
        reporter.cancel()
    if args.echo:
        echo_task.cancel()
    driver.stop()
    emit(event="stats", transport=endpoint.stats(), core=core.buffer_sizes())
    endpoint.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llft.tools.streamdemo", description=__doc__.splitlines()[0])
    p.add_argument("--key", required=True, help="cluster key file")
    p.add_argument("--group", required=True)
    p.add_argument("--me", type=int, required=True, help="this member's birth id")
    p.add_argument("--members", required=True, help="birth ids, primary first: 1,2,3")
    p.add_argument("--addresses", required=True, help="GROUP=MCAST:PORT,...")
    p.add_argument("--send-to", default="", help="group to stream to")
    p.add_argument("--send-bytes", type=int, default=0)
    p.add_argument("--expect-bytes", type=int, default=0, help="bytes to receive, then report")
    p.add_argument("--echo", action="store_true", help="write every delivered byte back")
    p.add_argument("--progress-s", type=float, default=0.0,
                   help="print a progress event this often (0: never)")
    p.add_argument("--seed", type=int, default=1, help="stream content seed")
    p.add_argument("--drop", type=float, default=0.0, help="receive-side datagram drop probability")
    p.add_argument("--payload-bytes", type=int, default=1300, help="data bytes per message")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(main_async(args))
    except keys.KeyFileError as e:
        print(f"llft: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
