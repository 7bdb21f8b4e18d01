"""Works until it is told to stop, as a server does: a line with the time every 5 ms
(clock reads: order information), then, at SIGINT (Ctrl-C: KeyboardInterrupt) or SIGTERM,
"stopped by ..." and exit status 0. A backup replays the signal at the same point."""
import signal
import sys
import time


def on_term(*_):
    raise SystemExit("SIGTERM")


signal.signal(signal.SIGTERM, on_term)
n = 0
try:
    while True:
        n += 1
        print(f"tick {n} {time.time()!r}", flush=True)
        time.sleep(0.005)
except KeyboardInterrupt:
    print(f"stopped by SIGINT after {n} ticks", flush=True)
except SystemExit as e:
    print(f"stopped by {e} after {n} ticks", flush=True)
sys.exit(0)
