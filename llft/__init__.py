"""llft: transparent leader-follower replication (LLFT) for unmodified Python processes.

Layout (one folder per concern; see docs/ARCHITECTURE.md):
  llft/           command line, wire format, transport, messaging core, simulator, benchmarks
  membership/     leader-determined membership protocol and fault detectors
  determinizer/   virtual determinizer: order info, CMTS/CTS/CSCS, record/replay
  native/         the LD_PRELOAD shim (C) and the shared-memory header
"""
__version__ = "0.1.0"
