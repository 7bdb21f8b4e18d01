"""An asyncio TCP counter server on the group's service port (non-blocking sockets,
epoll). Run: python group_async.py HOST|any PORT NCONNS  (`any`: asyncio binds every
address family it finds, IPv4 and IPv6). Ends when NCONNS connections are closed."""
import asyncio
import random
import sys
import time

host = None if sys.argv[1] == "any" else sys.argv[1]
port, nconns = int(sys.argv[2]), int(sys.argv[3])
state = {"counter": 0, "conns": 0, "closed": 0}


async def handle(reader, writer):
    idx = state["conns"]
    state["conns"] += 1
    print("accepted", idx, writer.get_extra_info("peername")[:2], flush=True)
    while line := await reader.readline():
        state["counter"] += 1
        await asyncio.sleep(random.random() / 1000)
        writer.write(f"{idx} {line.strip().decode()} n={state['counter']} t={time.time():.6f} "
                     f"r={random.random():.6f}\n".encode())
        await writer.drain()
    writer.close()
    await writer.wait_closed()
    state["closed"] += 1
    if state["closed"] == nconns:
        finished.set()


async def main():
    global finished
    finished = asyncio.Event()
    server = await asyncio.start_server(handle, host, port)
    print("listening", sorted({s.getsockname()[1] for s in server.sockets}), flush=True)
    await finished.wait()
    server.close()
    await server.wait_closed()
    print("done", state["counter"], flush=True)


asyncio.run(main())
