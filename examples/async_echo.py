"""An asyncio TCP echo service: one event loop, any number of connections at once.

Nothing here knows about llft: it runs the same plainly and under `llft run`. Each
connection gets back every byte it sends, as received; after the client's FIN the service
closes its side.

    python examples/async_echo.py [PORT]        (default 9000, listens on 0.0.0.0)
"""
import asyncio
import sys


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(serve_connection, "0.0.0.0", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 9000))
    except KeyboardInterrupt:
        sys.exit(0)
