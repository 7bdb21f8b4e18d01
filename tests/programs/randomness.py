"""random, os.urandom, uuid4, secrets, /dev/urandom; writes a file too."""
import os
import random
import secrets
import uuid

print("random", random.random(), random.randint(0, 10**9))
print("choice", random.choice(["a", "b", "c", "d", "e", "f"]))
print("urandom", os.urandom(16).hex())
print("uuid4", uuid.uuid4())
print("token", secrets.token_hex(16))
print("sysrandom", random.SystemRandom().random())
with open("/dev/urandom", "rb") as f:
    print("dev_urandom", f.read(8).hex())
rnd = random.Random()
with open("random_out.txt", "w") as f:
    for _ in range(20):
        f.write(f"{rnd.random()} {uuid.uuid4()}\n")
print("wrote random_out.txt")
