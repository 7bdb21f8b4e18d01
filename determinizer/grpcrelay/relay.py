"""The relay: the real gRPC client calls a replicated app's channels stand for.

Runs outside the app (a child of `llft record` or of a replica's agent), so grpcio's
C-core and its thread pool never run inside a determinized process. Every accepted
connection is served by a thread of its own, one call at a time (frames.py); channels
to the same target with the same options are shared. Bad input (a frame that is not
one, an unknown call kind) closes that connection with one log line; the relay and
its other connections go on.

    python -m determinizer.grpcrelay.relay --fd N [--parent PID]

serves the listening socket N it inherited (determinizer/grpcrelay/__init__.py binds it,
and starts this process only when a first connection is waiting). With --parent it dies
with that process (PR_SET_PDEATHSIG), so it never outlives its agent.
"""
from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import sys
import threading
from typing import Callable

import grpc

from determinizer.grpcrelay import frames
from llft.lifetime import die_with


def _log(msg: str) -> None:
    print(f"llft grpc-relay[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


def _identity(b):
    return b


class Relay:
    def __init__(self, sock: socket.socket):
        self.sock = sock                            # listening
        self._channels: dict[tuple, grpc.Channel] = {}
        self._lock = threading.Lock()

    def channel(self, target: str, options) -> grpc.Channel:
        key = (target, tuple(map(tuple, frames.options_out(options))))
        with self._lock:
            ch = self._channels.get(key)
            if ch is None:
                ch = self._channels[key] = grpc.insecure_channel(target, options=list(key[1]))
            return ch

    def serve_forever(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    # ---- one connection --------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                head = frames.read(conn)
                if head is None:
                    return
                self._call(conn, head)
        except frames.FrameError as e:
            _log(f"closing a connection: {e}")
        except OSError:
            pass                                    # the app went away
        except (ValueError, TypeError, KeyError) as e:   # a header field of the wrong type
            _log(f"closing a connection: a malformed call ({type(e).__name__}: {e})")
        finally:
            conn.close()

    def _requests(self, conn: socket.socket, head: dict):
        """The call's request messages, as the app sends them."""
        if "m" in head:
            yield head["m"]
        if head.get("end"):
            return
        while True:
            f = frames.read(conn)
            if f is None:
                raise frames.FrameError("connection closed inside a call's requests")
            if "m" in f:
                yield f["m"]
            if f.get("end"):
                return

    def _call(self, conn: socket.socket, head: dict) -> None:
        kind, method = head.get("kind"), head.get("method")
        if kind not in frames.KINDS or not isinstance(method, str) or "target" not in head:
            raise frames.FrameError(f"not a call: kind {kind!r}, method {method!r}")
        ch = self.channel(head["target"], head.get("options"))
        factory = {"uu": ch.unary_unary, "us": ch.unary_stream,
                   "su": ch.stream_unary, "ss": ch.stream_stream}[kind]
        mc = factory(method, request_serializer=_identity, response_deserializer=_identity)
        kw = dict(timeout=head.get("timeout"),
                  metadata=[tuple(p) for p in head.get("metadata") or ()] or None,
                  wait_for_ready=head.get("wait_for_ready"),
                  compression=(grpc.Compression(head["compression"])
                               if head.get("compression") is not None else None))
        reqs = self._requests(conn, head)
        if kind in ("uu", "us"):                    # one request, then the "end"
            got = list(reqs)
            if len(got) != 1:
                raise frames.FrameError(f"a unary call with {len(got)} requests")
            reqs = got[0]
        send = lambda obj: conn.sendall(frames.encode(obj))  # noqa: E731
        if kind in ("uu", "su"):
            try:
                resp, call = mc.with_call(reqs, **kw)
            except grpc.RpcError as e:
                send({"im": frames.metadata_out(e.initial_metadata())})
                send(self._status(e))
                return
            send({"im": frames.metadata_out(call.initial_metadata())})
            send({"m": resp})
            send(self._status(call))
            return
        call = mc(reqs, **kw)
        unwatch = _cancel_on_close(conn, call) if kind == "us" else lambda: None
        try:
            send({"im": frames.metadata_out(call.initial_metadata())})
            for resp in call:
                send({"m": resp})
        except grpc.RpcError:
            pass                                    # the status below says it
        except OSError:
            call.cancel()                           # the app went away: so does the call
            raise
        finally:
            unwatch()
        send(self._status(call))

    @staticmethod
    def _status(call) -> dict:
        code = call.code() or grpc.StatusCode.UNKNOWN
        return {"code": code.value[0], "details": call.details() or "",
                "tm": frames.metadata_out(call.trailing_metadata())}


def _cancel_on_close(conn: socket.socket, call) -> "Callable[[], None]":
    """While a stream of responses runs, the app sends nothing: a readable connection is
    its close (a cancelled call, a stream dropped, the app gone), and cancels the call
    (which may wait for a response that never comes). Returns the stop function."""
    stop_r, stop_w = os.pipe()

    def watch() -> None:
        try:
            ready, _, _ = select.select([conn, stop_r], [], [])
            if conn in ready and not conn.recv(1, socket.MSG_PEEK):
                call.cancel()
        except (OSError, ValueError):
            call.cancel()
        finally:
            os.close(stop_r)

    th = threading.Thread(target=watch, daemon=True, name="relay-cancel-watch")
    th.start()

    def stop() -> None:
        os.write(stop_w, b"x")
        th.join()
        os.close(stop_w)
    return stop


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m determinizer.grpcrelay.relay")
    p.add_argument("--fd", type=int, required=True, help="an inherited listening socket")
    p.add_argument("--parent", type=int, default=0)
    a = p.parse_args(argv)
    if a.parent:
        die_with(a.parent)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    Relay(socket.socket(fileno=a.fd)).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
