"""A file the program writes, then judges by its timestamps against the clock (logging's
TimedRotatingFileHandler decides a rollover from the log file's st_mtime): a backup must
see the primary's file times, as it sees the primary's clock. Prints both."""
import os
import time

with open("times_out.txt", "w") as f:
    f.write("written at %d\n" % time.time_ns())
st = os.stat("times_out.txt")
now = time.time_ns()
print("mtime", st.st_mtime_ns, "ctime", st.st_ctime_ns, "now", now)
print("age ms", (now - st.st_mtime_ns) // 1_000_000, "roll over", now - st.st_mtime_ns > 2_000_000)
