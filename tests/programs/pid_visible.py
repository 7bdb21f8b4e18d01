"""The process id is an input (logging puts it in every LogRecord): a backup must see
the primary's, and kill() of that pid must still reach this process. (Only with
LLFT_GROUP_PID=1 in the environment: replicas sharing a host would otherwise share every
file named after the process id.)"""
import os
import signal

got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(os.getpid()))
os.kill(os.getpid(), signal.SIGUSR1)
print("pid", os.getpid(), "handler saw", got)
