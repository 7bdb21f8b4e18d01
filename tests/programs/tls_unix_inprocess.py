"""TLS between two threads of the process over a unix socket (test_asyncio.test_streams'
open_unix_connection(ssl=...) in small): a blocking TLS server thread, an asyncio client
in the main thread. Everything TLS sends is random (OpenSSL mixes in the CPU clock), and
how the client's reads are chunked is timing (its epoll reported the server's two session
tickets one by one at the primary): a backup must read what the primary read, where it
read it. Every other reply comes a TLS record per byte: the chunks the client reads
vary by run."""
import asyncio, os, socket, ssl, tempfile, threading, test

CERT = os.path.join(os.path.dirname(test.__file__), "certdata", "keycert.pem")
path = os.path.join(tempfile.mkdtemp(), "tls.sock")
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen()


def serve(rounds):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(CERT)
    for i in range(rounds):
        conn, _ = listener.accept()
        with ctx.wrap_socket(conn, server_side=True) as tls:
            line = tls.makefile("rb").readline()
            if i % 2:   # a TLS record per byte: how the client's reads group them is timing
                for b in b"echo " + line:
                    tls.sendall(bytes([b]))
            else:
                tls.sendall(b"echo " + line)


async def client(i):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    reader, writer = await asyncio.open_unix_connection(path, ssl=ctx, server_hostname="")
    writer.write(b"hello %d\n" % i)
    reply, chunks = b"", []
    while data := await reader.read(100):
        reply += data
        chunks.append(len(data))
    version = writer.get_extra_info("ssl_object").version()
    writer.close()
    await writer.wait_closed()
    return reply, version, chunks


ROUNDS = 5
server = threading.Thread(target=serve, args=(ROUNDS,))
server.start()
for i in range(ROUNDS):
    print(*asyncio.run(client(i)))
server.join()
os.unlink(path)
