"""The deterministic simulator: `kernel` (seeded clock, event heap, faulty multicast
network over the real wire codec, crashes, partitions, injection), the protocol checks run
by `llft simulate KIND` (`messaging_check`, `membership_check`, `replica_check`) and the
campaign runner they share (`campaign`: seeds, flags, output, scenario scripts)."""
