"""The runtime, the layer that does I/O: UDP multicast transport, the asyncio driver of the
sans-IO cores, the replica agent (`llft run`), the gateway, configuration, keys, status files."""
