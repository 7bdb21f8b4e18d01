"""The counter service over HTTP: the standard library's threading HTTP server, one
connection per request (HTTP/1.0: the server closes the connection after each reply).

Nothing here knows about llft. It shares examples/kv_counter.py's state and reply line:

    python examples/http_counter.py [PORT]      (default 9000, listens on 0.0.0.0)

    GET /incr/<key>   -> 200, body: OK <key> <key_count> <global_count> <time.time()!r> <8 hex>
    GET /get/<key>    -> 200 "OK <key> <value>" | 404
    anything else     -> 404
"""
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_counter  # noqa: E402  (the example next to this one: the same counter)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"       # one request per connection

    def do_GET(self):                   # noqa: N802 (http.server's name)
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] in ("incr", "get") and parts[1]:
            reply = kv_counter.handle(f"{parts[0].upper()} {parts[1]}")
            status = 200 if reply.startswith("OK") else 404
        else:
            reply, status = f"ERR unknown path {self.path[:80]!r}", 404
        body = (reply + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):       # no line per request on stderr
        pass


def main() -> int:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
