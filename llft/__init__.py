"""llft: transparent leader-follower replication (LLFT) for unmodified Python processes.

Layers, imports only downward (docs/ARCHITECTURE.md draws them):
  llft/cli.py, llft/demos/, llft/bench/   the `llft` command, demos, benchmarks
  llft/spark/                             the replicated-Spark harness (Nexmark pipeline runs)
  llft/tools/                             local clusters, load clients, sniffer, stream members
  llft/runtime/                           I/O: transport, drivers, agent (`llft run`), gateway,
                                          configuration, keys, status files
  llft/sim/                               the seeded simulator and the protocol checks
  llft/replica/                           a replica node: membership + messaging, sans-IO
  membership/                             the leader-determined membership protocol, sans-IO
  llft/protocol/                          messages, wire codec, messaging protocol, sans-IO
  determinizer/ -> native/                order info, shared memory, record/replay; the shim
"""
import os

__version__ = "0.1.0"

# The checkout's examples/ (the unmodified applications demos, benchmarks and tests run).
EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
