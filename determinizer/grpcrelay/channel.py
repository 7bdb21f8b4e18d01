"""A gRPC client channel that runs no gRPC inside the app: every call goes to the relay.

Why: grpcio's C-core (linked into its extension module, its API not interposable) runs
a native thread pool whose workers take work from a queue in no stable order, under
locks of its own (absl futexes) the shim does not see; a replay cannot make the same
worker make the same call. So a replicated app's gRPC client channels are this class
instead (determinizer/grpcrelay/site/sitecustomize.py installs it when the process is
started with a relay): pure Python over a loopback TCP connection to the relay, which
makes the real call. The connection is an EXTERNAL one for the shim (the relay is
outside the app's process tree): the primary records what it reads, a backup never
opens it and reads the primary's bytes -- so a backup makes no gRPC call at all.

Calls are synchronous in the calling thread: one connection per call in flight, kept in
a pool between calls. Deadlines are the relay's (the app sets no timer). A connection
that fails is dropped; a call whose request never left is retried once on a fresh
connection (this is what a promoted backup's first call meets: the connections it
replayed were never opened), otherwise the call ends with UNAVAILABLE, which gRPC
clients retry (Spark Connect reattaches to its execution by operation id).

What is not here: futures (`.future()`), callbacks, connectivity subscriptions, TLS
credentials (secure channels stay grpcio's own); a bidirectional stream sends all its
requests before it reads a response.
"""
from __future__ import annotations

import collections
import socket
import threading

import grpc

from . import frames     # relative: the app may load this package under another name

Metadatum = collections.namedtuple("Metadatum", ("key", "value"))
_CODES = {c.value[0]: c for c in grpc.StatusCode}


def _metadata_in(md) -> tuple:
    return tuple(Metadatum(k, v) for k, v in md or ())


class _Lost(Exception):
    """The relay connection failed (the call ends UNAVAILABLE)."""


class _Conn:
    def __init__(self, addr):
        self.sock = socket.create_connection(addr)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, obj: dict) -> None:
        self.sock.sendall(frames.encode(obj))

    def read(self) -> dict:
        f = frames.read(self.sock)
        if f is None:
            raise frames.FrameError("the relay closed the connection")
        return f

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Outcome(grpc.RpcError, grpc.Call):
    """A finished call: its metadata and status (the RpcError raised when not OK)."""

    def __init__(self, code, details, initial=(), trailing=()):
        super().__init__()
        self._code, self._details = code, details
        self._initial, self._trailing = initial, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def initial_metadata(self):
        return self._initial

    def trailing_metadata(self):
        return self._trailing

    def debug_error_string(self):
        return f"relayed call: {self._code} {self._details}"

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False

    def __str__(self):
        return (f"<{type(self).__name__} of RPC that terminated with:\n\tstatus = {self._code}"
                f"\n\tdetails = \"{self._details}\"\n>")

    __repr__ = __str__


class _Stream(grpc.RpcError, grpc.Call):
    """A call with a stream of responses: an iterator that is also its Call."""

    def __init__(self, channel, conn, deserialize, failed: "_Outcome | None" = None):
        super().__init__()
        self._channel, self._conn, self._des = channel, conn, deserialize
        self._initial = None
        # like grpc's, a failure shows when the responses are read, not at the call
        # (Spark Connect retries only there: its first ExecutePlan is not retried)
        self._outcome: _Outcome | None = failed
        self._buffered = collections.deque()

    def _frame(self) -> dict | None:
        """The next frame; None if the connection failed (the outcome says so)."""
        try:
            return self._conn.read()
        except (OSError, frames.FrameError) as e:
            self._conn.close()
            self._conn = None
            self._outcome = _Outcome(grpc.StatusCode.UNAVAILABLE,
                                     f"connection to the llft gRPC relay lost: {e}",
                                     self._initial or ())
            return None

    def _read_initial(self) -> bool:
        """The call's first frame, its initial metadata (once); False if it failed."""
        if self._initial is None and self._outcome is None:
            f = self._frame()
            if f is not None:
                self._initial = _metadata_in(f.get("im"))
        return self._initial is not None

    def _next_raw(self):
        """The next response's bytes; None once the status came (self._outcome)."""
        if self._outcome is not None or not self._read_initial():
            return None
        f = self._frame()
        if f is None:
            return None
        if "m" in f:
            return f["m"]
        self._outcome = _Outcome(_CODES.get(f.get("code"), grpc.StatusCode.UNKNOWN),
                                 f.get("details", ""), self._initial or (),
                                 _metadata_in(f.get("tm")))
        self._channel._give(self._conn)
        self._conn = None
        return None

    def __iter__(self):
        return self

    def __next__(self):
        if self._buffered:
            return self._des(self._buffered.popleft())
        raw = self._next_raw()
        if raw is not None:
            return self._des(raw)
        if self._outcome.code() is grpc.StatusCode.OK:
            raise StopIteration
        raise self._outcome

    next = __next__

    def _finish(self) -> _Outcome:
        while self._outcome is None:                 # like grpc: these wait for the end
            raw = self._next_raw()
            if raw is not None:
                self._buffered.append(raw)
        return self._outcome

    def code(self):
        return self._finish().code()

    def details(self):
        return self._finish().details()

    def trailing_metadata(self):
        return self._finish().trailing_metadata()

    def initial_metadata(self):
        self._read_initial()
        return self._initial

    def is_active(self):
        return self._outcome is None

    def time_remaining(self):
        return None

    def cancel(self):
        if self._outcome is not None:
            return False
        if self._conn is not None:                   # the relay cancels the real call
            self._conn.close()
            self._conn = None
        self._outcome = _Outcome(grpc.StatusCode.CANCELLED, "Locally cancelled by application!",
                                 self._initial or ())
        return True

    def add_callback(self, callback):
        return False

    def debug_error_string(self):
        return self._finish().debug_error_string()

    def __del__(self):
        if getattr(self, "_conn", None) is not None:  # abandoned mid-stream
            self._conn.close()


class _MultiCallable:
    def __init__(self, channel: "RelayChannel", method: str, kind: str, serialize, deserialize):
        self._ch, self._method, self._kind = channel, method, kind
        self._ser = serialize or (lambda b: b)
        self._des = deserialize or (lambda b: b)

    def _begin(self, request, timeout, metadata, wait_for_ready, compression):
        """Send the call; return its connection (one retry if nothing left)."""
        head = {"target": self._ch._target, "options": self._ch._options,
                "method": self._method, "kind": self._kind,
                "metadata": frames.metadata_out(metadata), "timeout": timeout,
                "wait_for_ready": wait_for_ready,
                "compression": int(compression) if compression is not None else None}
        streaming = self._kind in ("su", "ss")
        if not streaming:
            head["m"], head["end"] = self._ser(request), True
        for attempt in (0, 1):
            conn = self._ch._take()
            try:
                conn.send(head)
                break
            except OSError as e:
                conn.close()
                self._ch._drop_idle()           # they were opened by the same (gone) primary
                if attempt:
                    raise _Lost(f"cannot reach the llft gRPC relay: {e}") from None
        if streaming:
            try:
                for req in request:
                    conn.send({"m": self._ser(req)})
                conn.send({"end": True})
            except OSError as e:
                conn.close()
                raise _Lost(f"connection to the llft gRPC relay lost: {e}") from None
        return conn

    def _call(self, request, timeout=None, metadata=None, credentials=None,
              wait_for_ready=None, compression=None) -> _Stream:
        try:
            conn = self._begin(request, timeout, metadata, wait_for_ready, compression)
        except _Lost as e:
            return _Stream(self._ch, None, self._des,
                           failed=_Outcome(grpc.StatusCode.UNAVAILABLE, str(e)))
        return _Stream(self._ch, conn, self._des)

    # unary response (uu, su)
    def with_call(self, request, timeout=None, metadata=None, credentials=None,
                  wait_for_ready=None, compression=None):
        stream = self._call(request, timeout, metadata, credentials, wait_for_ready, compression)
        raw = stream._next_raw()
        outcome = stream._finish()                   # a failed call: raised here, as grpc does
        if outcome.code() is not grpc.StatusCode.OK:
            raise outcome
        if raw is None:
            raise _Outcome(grpc.StatusCode.INTERNAL, "the relay sent no response message",
                           outcome.initial_metadata(), outcome.trailing_metadata())
        return self._des(raw), outcome

    def future(self, *a, **kw):
        raise NotImplementedError("futures are not relayed (llft gRPC relay): use the "
                                  "blocking call")


class _UnaryResponse(_MultiCallable):
    def __call__(self, request, timeout=None, metadata=None, credentials=None,
                 wait_for_ready=None, compression=None):
        return self.with_call(request, timeout, metadata, credentials, wait_for_ready,
                              compression)[0]


class _StreamResponse(_MultiCallable):
    def __call__(self, request, timeout=None, metadata=None, credentials=None,
                 wait_for_ready=None, compression=None):
        return self._call(request, timeout, metadata, credentials, wait_for_ready, compression)


class RelayChannel(grpc.Channel):
    """grpc.insecure_channel(target, options) whose calls the relay at `relay` makes."""

    def __init__(self, relay: tuple[str, int], target: str, options=None):
        self._relay, self._target = relay, target
        self._options = frames.options_out(options)
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        self._closed = False

    def _take(self) -> _Conn:
        with self._lock:
            if self._closed:
                raise ValueError("Cannot invoke RPC: Channel closed!")
            if self._idle:
                return self._idle.pop()
        try:
            return _Conn(self._relay)
        except OSError as e:
            raise _Lost(f"cannot reach the llft gRPC relay at {self._relay[0]}:"
                        f"{self._relay[1]}: {e}") from None

    def _give(self, conn: _Conn) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    def _drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def unary_unary(self, method, request_serializer=None, response_deserializer=None,
                    _registered_method=False):
        return _UnaryResponse(self, method, "uu", request_serializer, response_deserializer)

    def unary_stream(self, method, request_serializer=None, response_deserializer=None,
                     _registered_method=False):
        return _StreamResponse(self, method, "us", request_serializer, response_deserializer)

    def stream_unary(self, method, request_serializer=None, response_deserializer=None,
                     _registered_method=False):
        return _UnaryResponse(self, method, "su", request_serializer, response_deserializer)

    def stream_stream(self, method, request_serializer=None, response_deserializer=None,
                      _registered_method=False):
        return _StreamResponse(self, method, "ss", request_serializer, response_deserializer)

    def subscribe(self, callback, try_to_connect=False):
        pass

    def unsubscribe(self, callback):
        pass

    def close(self):
        with self._lock:
            self._closed = True
        self._drop_idle()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
