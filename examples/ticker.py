"""A replicated process that works on its own: no client, no input, only time.

    llft run --config cluster.toml --group ticker -- python examples/ticker.py [TICK_MS]

Every TICK_MS (default 1) it sleeps, reads the clock and draws a random number: each
of those is order information its primary records and its backups replay, so the
group's log grows steadily with the group's age. `llft bench join` measures how long a
joining replica takes to replay that log; the lag tests slow a backup of it down.
"""
import random
import sys
import time

tick_s = (float(sys.argv[1]) if len(sys.argv) > 1 else 1.0) / 1000
total = 0.0
while True:
    time.sleep(tick_s)
    total += time.time() % 1 + random.random()
