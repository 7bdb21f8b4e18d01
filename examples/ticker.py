"""A replicated process that works on its own: no client, no input, only time.

    llft run --config cluster.toml --group ticker -- python examples/ticker.py [TICK_MS [WORK [TICKS]]]

Every TICK_MS (default 1) it sleeps, reads the clock, draws a random number and does
WORK (default 0) iterations of arithmetic: the first three are order information its
primary records and its backups replay, so the group's log grows steadily with the
group's age; WORK is computation a replaying backup must redo. `llft bench join`
measures how long a joining replica takes to replay that log; the lag tests
(tests/processes/test_lag.py) slow a backup of it down. With TICKS it stops after that
many ticks, says so on stderr, and then waits for a signal making nothing (an idle
group: a new primary view with no order information in it).
"""
import random
import signal
import sys
import time

tick_s = (float(sys.argv[1]) if len(sys.argv) > 1 else 1.0) / 1000
work = int(sys.argv[2]) if len(sys.argv) > 2 else 0
ticks = int(sys.argv[3]) if len(sys.argv) > 3 else 0
total = 0.0
n = 0
while not ticks or n < ticks:
    time.sleep(tick_s)
    total += time.time() % 1 + random.random()
    for i in range(work):
        total += i * 1e-9
    n += 1
print(f"ticker: {n} ticks done", file=sys.stderr, flush=True)
while True:
    signal.pause()
