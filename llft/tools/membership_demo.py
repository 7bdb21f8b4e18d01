"""`python -m llft.tools.membership_demo`: one replica of a group, membership only, on loopback multicast.

Run three of these with the same --group/--key/--addresses: the first founds the group,
the others join; SIGKILL the primary and the survivors elect the next one; SIGKILL a
backup and the primary removes it; start another and it joins with a higher precedence.

Output: JSON lines on stdout, one `{"event": "status", ...}` whenever this replica's
status, view or membership changes (see `MembershipDriver.status`), after a
`{"event": "ready"}` once the sockets are open. Tests wait on these lines.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time

from llft.runtime import keys
from llft.runtime.transport import GroupMap
from membership.core import Config
from llft.runtime.membership_driver import MembershipDriver


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


async def main_async(args: argparse.Namespace) -> int:
    ms = 1000
    base = int(args.timeout_ms * ms)
    cfg = Config(group=args.group, heartbeat_interval_us=int(args.heartbeat_ms * ms),
                 timeout_base_us=base, backup_timeout_us=2 * base, ack_timeout_us=2 * base,
                 retransmit_us=int(args.heartbeat_ms * ms),
                 join_retry_us=2 * int(args.heartbeat_ms * ms),
                 found_timeout_us=4 * base, host=os.uname().nodename, pid=os.getpid())
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    md = MembershipDriver(keys.load_key(args.key), cfg, groups=GroupMap.parse(args.addresses),
                          rng=rng)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await md.start()
    emit(event="ready", pid=os.getpid())
    last = None
    t0 = time.monotonic()
    while not stop.is_set():
        snap = md.status()
        if snap != last:
            # mono: CLOCK_MONOTONIC is system-wide, so benches compare it across processes
            emit(event="status", t=round(time.monotonic() - t0, 4), mono=time.monotonic(), **snap)
            last = snap
        md.driver.progress.clear()
        waiter = asyncio.ensure_future(md.driver.progress.wait())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()
    md.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", required=True)
    p.add_argument("--key", required=True, help="cluster key file (llft keygen)")
    p.add_argument("--addresses", required=True, help="GROUP=MCAST:PORT,...")
    p.add_argument("--heartbeat-ms", type=float, default=5.0)
    p.add_argument("--timeout-ms", type=float, default=25.0,
                   help="fault detector base timeout (rank 2); rank r waits (2r-3) times it")
    args = p.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
