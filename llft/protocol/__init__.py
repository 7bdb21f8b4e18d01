"""The protocol layer, sans-IO: message vocabulary (`messages`), the authenticated wire codec
(`wire`) and the LLFT messaging protocol (`messaging`). Nothing here reads a clock, a socket
or a random source; drivers (llft/runtime in production, llft/sim in tests) do."""
