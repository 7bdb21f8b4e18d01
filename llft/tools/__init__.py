"""Tools built on the runtime: local clusters of `llft run` processes (tests, demos, benches),
load clients, the traffic sniffer and its scapy layer, stand-alone stream and membership members."""
