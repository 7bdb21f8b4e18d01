"""Object addresses (id(), default reprs): they differ between plain runs because of
ASLR; the agent runs replicas with ASLR off and the same environment."""
import os

print(object())
print(hex(id([])), hex(id(print)))
print(sorted(k for k in os.environ if k.startswith(("LLFT", "LD_"))))
