"""pthread mutexes of a C library, driven through ctypes (ctypes drops the GIL around
each foreign call, like a C extension doing blocking work): threads contend on a
mutex and on trylock; the order of acquisition is printed."""
import ctypes
import threading

libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)          # >= sizeof(pthread_mutex_t)
assert libc.pthread_mutex_init(mutex, None) == 0
order = []
busy = []


def worker(i):
    for r in range(60):
        libc.usleep(10 * i)                        # outside the mutex too
        if libc.pthread_mutex_trylock(mutex) != 0:
            busy.append(i)                         # under the GIL, no other mutex held
            libc.pthread_mutex_lock(mutex)
        order.append(i)                            # protected by the C mutex
        libc.usleep(30 + 40 * (r % 3))             # hold it a while, GIL dropped
        libc.pthread_mutex_unlock(mutex)


threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.pthread_mutex_destroy(mutex)
print("".join(map(str, order)))
print("busy", len(busy))
