"""test_queue's race in small: feeder threads share a list and a random.Random with no
lock, and consumers take from a SimpleQueue; only the GIL's hand-offs decide the order.
Prints the order in which items were produced and consumed (differs between plain runs)."""
import hashlib
import queue
import random
import threading

N_FEEDERS, N_CONSUMERS, ITEMS = 8, 3, 20000
rnd = random.Random(1)            # shared, unlocked (as in test_queue)
produced = []                     # shared, unlocked
consumed = [[] for _ in range(N_CONSUMERS)]
q = queue.SimpleQueue()


def feeder(k):
    for i in range(ITEMS):
        x = rnd.random()
        produced.append((k, i))
        if x < 0.01:
            q.put((k, i))
    q.put(None)


def consumer(c):
    ends = 0
    while ends < N_FEEDERS // N_CONSUMERS + (c < N_FEEDERS % N_CONSUMERS):
        item = q.get()
        if item is None:
            ends += 1
        else:
            consumed[c].append(item)


threads = [threading.Thread(target=consumer, args=(c,)) for c in range(N_CONSUMERS)]
threads += [threading.Thread(target=feeder, args=(k,)) for k in range(N_FEEDERS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("produced", len(produced), hashlib.sha256(repr(produced).encode()).hexdigest()[:16])
print("consumed", [len(c) for c in consumed], hashlib.sha256(repr(consumed).encode()).hexdigest()[:16])
print("switches", sum(1 for a, b in zip(produced, produced[1:]) if a[0] != b[0]))
