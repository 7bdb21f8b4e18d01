"""A gRPC client (grpcio, generic calls, no protobuf) of the server at 127.0.0.1:PORT:
unary calls, a server stream and a client stream from two threads, a failing call, and
the clock. Under the shim its channel is the relay's (determinizer/grpcrelay/).

    python grpc_client.py PORT
"""
import sys
import threading
import time

import grpc

ch = grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}")
echo = ch.unary_unary("/t.S/Echo")
count = ch.unary_stream("/t.S/Count")
total = ch.stream_unary("/t.S/Total")
out: dict[int, list] = {}


def worker(i: int) -> None:
    got = [echo(f"w{i}-{k}".encode()) for k in range(5)]
    got.append(b",".join(count(str(3 + i).encode())))
    got.append(total(iter([str(k).encode() for k in range(i + 4)])))
    out[i] = got


threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
try:
    echo(b"fail")
except grpc.RpcError as e:
    print("error", e.code(), e.details())
for i in sorted(out):
    print(i, out[i])
print(type(ch).__name__, time.time())
