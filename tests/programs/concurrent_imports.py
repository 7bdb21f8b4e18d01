"""Threads importing at once: importlib holds CPython's import lock across finder
calls that release the GIL (stat, listdir), so the threads contend on it. Each thread
imports its own modules and a shared one, lazily, and notes when each import returned;
the order differs from run to run (shim_locks.c, import_lock_order_start)."""
import threading
import time

MODULES = [["json", "csv"], ["decimal", "fractions"], ["email.message", "html.parser"],
           ["xml.dom.minidom", "tomllib"]]
SHARED = "statistics"
done: list[str] = []


def importer(i: int) -> None:
    for name in MODULES[i] + [SHARED]:
        __import__(name)
        done.append(f"{i}:{name}")
        time.sleep(0)                       # a GIL hand-off between imports


threads = [threading.Thread(target=importer, args=(i,)) for i in range(len(MODULES))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(" ".join(done))
print(time.time())
