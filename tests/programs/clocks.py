"""Clock readings that reach the application: time.time, time.monotonic,
time.perf_counter, datetime.now, and sleep-driven timeouts (how many iterations fit
before a deadline)."""
import datetime
import time

print("time", time.time())
print("time_ns", time.time_ns())
print("monotonic", time.monotonic())
print("perf_counter", time.perf_counter())
print("now", datetime.datetime.now().isoformat())
print("utcnow", datetime.datetime.utcnow().isoformat())
print("clock_gettime", time.clock_gettime(time.CLOCK_REALTIME))
start = time.monotonic()
n = 0
while time.monotonic() - start < 0.05:       # busy loop: the count depends on speed
    n += 1
print("busy iterations", n)
t0 = time.perf_counter()
sleeps = 0
while time.perf_counter() - t0 < 0.03:       # sleep-driven timeout
    time.sleep(0.001)
    sleeps += 1
print("sleeps", sleeps)
deadline = time.time() + 0.02
ticks = 0
while time.time() < deadline:
    time.sleep(0.0005)
    ticks += 1
print("ticks", ticks)
print("elapsed", round(time.monotonic() - start, 6))
