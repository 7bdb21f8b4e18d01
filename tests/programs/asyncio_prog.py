"""asyncio with timers (sleep, call_later, wait_for timeouts) and a socket to an
external server."""
import asyncio
import sys
import time

port = int(sys.argv[1])


async def ticker(log):
    for i in range(5):
        await asyncio.sleep(0.002)
        log.append(f"tick {i} {time.monotonic():.6f}")


async def main():
    log = []
    loop = asyncio.get_running_loop()
    loop.call_later(0.003, lambda: log.append(f"call_later at {loop.time():.6f}"))
    t = asyncio.create_task(ticker(log))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(4):
        writer.write(b"async-%d\n" % i)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout=5)
        log.append("reply " + line.decode().strip())
    try:
        await asyncio.wait_for(reader.readline(), timeout=0.01)   # nothing comes
    except asyncio.TimeoutError:
        log.append("timeout as expected")
    writer.close()
    await writer.wait_closed()
    await t
    for line in log:
        print(line)


asyncio.run(main())
