"""The virtual determinizer (LLFT paper, "virtual determinizer framework").

- `orderinfo`   the order-information entry (t, o, n, d), its names and its codec (the
                bytes that ride in `Message.order_info`);
- `shm`         the shared-memory block between an agent and its app's preload shim:
                `Primary.drain()` (shim -> network) and `Backup.feed()` (network -> shim);
- `runner`      starting an unmodified command under the shim (ASLR off, identical
                environment) as a primary or as a backup;
- `recordreplay` `llft record` / `llft replay`: a trace file is one source of order
                information for a backup, the network is another; both go through the
                same feeder.
The interception itself is the preload shim, native/shim_*.c (one unit per concern).
"""
