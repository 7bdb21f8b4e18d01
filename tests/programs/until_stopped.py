"""Works, then waits until it is told to stop, as a server does: 100 lines with the time
(clock reads: order information), "waiting", then a long sleep that SIGINT (Ctrl-C:
KeyboardInterrupt) or SIGTERM interrupts: "stopped by ...", exit status 0. The test
signals it only once it sleeps, so the signal interrupts a call, which a backup replays at
the same point (a signal arriving while Python code runs is replayed later than at the
primary: determinizer/README.md, limits)."""
import signal
import sys
import time


def on_term(*_):
    raise SystemExit("SIGTERM")


signal.signal(signal.SIGTERM, on_term)
for n in range(1, 101):
    print(f"tick {n} {time.time()!r}")
print("waiting", flush=True)
try:
    time.sleep(3600)
except KeyboardInterrupt:
    print("stopped by SIGINT", flush=True)
except SystemExit as e:
    print(f"stopped by {e}", flush=True)
sys.exit(0)
