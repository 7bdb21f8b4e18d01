"""The deterministic simulator: `kernel` (seeded clock, event heap, faulty multicast
network over the real wire codec, crashes, partitions, injection) and the protocol
checks run by `llft simulate KIND` (`messaging_check` here, `llft.sim.membership_check`)."""
