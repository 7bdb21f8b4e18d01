"""`llft gateway`: carries plain TCP clients into a replicated group.

    llft gateway --config cluster.toml --group counter --listen 127.0.0.1:7000

Theory of operation
-------------------
Plain TCP clients cannot speak LLFT, so the gateway speaks it for them. The gateway is
a one-member LLFT group of its own: group id `<NAME>.gateway.<instance>` (`GroupConfig.
gateway_group`, `gateway_instance`: one per host and listening address, so clients on
several hosts each run their own gateway and none disturbs another's connection; all of
them listen on the group's `gateway_address` and each keeps only what is addressed to
its own id), with a `MessagingEndpoint`
in a static view where it is the primary, alone (`set_view(1, birth, [(birth, 1)],
birth)`), driven by `llft.runtime.driver.Driver` over a `transport.Endpoint` (given its birth
id, so it drops its own multicast echoes). Addresses come from the configuration's
`group_map()`, the HMAC key from its key file.

The gateway holds ONE messaging connection to group NAME (`open(NAME, conn_seq,
Role.CLIENT)`, conn_seq a random 40-bit number drawn when the gateway starts, so a
restarted gateway never reuses a connection the servers still remember), and every
accepted TCP client is a *stream* inside it, numbered 1, 2, ... (llft/protocol/streams.py:
frames of DATA, FIN, RST). So the control traffic between the gateway and the group --
acknowledgements, keep-alives, retransmission timers, watermarks -- is one connection's,
however many clients come and go, and replies of many clients share messages.
The connection is opened by the first client and closed (its end, freed at every
replica) once no stream has been open for IDLE_CLOSE_S; the next client opens the next
one (conn_seq + 1). An open connection costs the group's primary a keep-alive every
keep-alive interval even when idle (they are the evidence a probing backup asks remote
groups for: membership/core.py), so an idle gateway holds none.

- Opening: an accepted client's stream opens with an empty DATA frame at once, so the
  group's application accepts the connection even before the client says anything (a
  server that speaks first gets its client).
- Client -> group: bytes read from a client become DATA frames, appended to the
  connection's output (`out`) and given to messaging as it admits them (`send`). The
  group connection is the unit of flow control: while `out` holds more than
  OUT_HIGH_BYTES (messaging's own queue and window are full) the gateway reads no client
  (TCP flow control pushes back on them) until it drains below OUT_LOW_BYTES. Load
  beyond what the group takes waits in the clients' sockets, not in datagrams queued
  at the servers.
- Group -> client: `Deliver` actions of the connection are the group's byte stream,
  de-duplicated by offset (after a failover of the group's primary, messaging's phase 2
  may resend bytes the gateway already has: dropped and counted; a gap would be a bug:
  counted, logged, and every client is reset rather than given a corrupt stream), cut
  into frames; each frame's payload goes to its client, exactly once across failovers.
- Ends: a client's FIN (EOF) or reset ends its stream into the group (a FIN or RST
  frame, after its last byte): the app's recv returns 0 (or fails with ECONNRESET)
  exactly there, at every replica. The group's end of a stream becomes a FIN to the
  client (`write_eof`: a half-close; the client may still send) or a reset (SO_LINGER 0
  once every byte is out). A stream both of whose ends passed is freed: the client's
  socket is closed and nothing of it is left here. The gateway dropping a client (a
  client that does not read, shutdown) is a reset into the group.
- Slow clients: the gateway reads a client's next request only after its pending replies
  drained below the socket's high-water mark (`ClientSocket`, llft/runtime/sockets.py:
  reading pauses meanwhile), so a request/reply client that
  does not read cannot make the group produce unbounded output; a client whose unread
  replies still exceed `MAX_CLIENT_BACKLOG_BYTES` is disconnected.
- Leaving (SIGTERM): every client is reset, then the group connection's own end (FIN)
  goes to the group, which frees the connection there. Killed instead (SIGKILL), the
  gateway leaves its connection at the group until either a gateway with its id starts
  (the same host and --listen): it accepts no connection it did not open and answers
  CLOSED on the old one, which the group takes as the old gateway's reset (messaging
  `_on_closed`); or the group's primary has heard nothing from it for
  `remote_timeout_ms` (3 s) and takes it for gone (messaging `_remote_silence_due`).
  Either way its streams are reset after the same bytes at every replica and the
  connection is freed there; until then it pins the group's watermark, so the other
  gateways' connections wait once their window is full.

Output: one JSON line on stdout when ready, `{"event": "ready", "listen": [host, port],
"group": NAME}` (`--listen HOST:0` picks a free port); nothing else on stdout. A status
file (JSON, written atomically every 500 ms) at `<runtime_dir>/<NAME>/gateway-<pid>.json`
holds the counters; it is removed at exit. Configuration, key and bind errors print one
line `llft gateway: ...` on stderr and exit 2; SIGTERM/SIGINT exit 0.

Logs: warnings and errors (and with --verbose, more) on stderr, each line with the UTC
time and the name `gw:<group>` (llft/runtime/logs.py, the same set-up as `llft run`).
The status loop is a task with an owner (llft/runtime/tasks.py: its failure is logged and
the gateway exits 70); a client's handler logs an unexpected error and drops that client;
the loop's exception handler logs whatever else asyncio would print, with its context.

Processes: the gateway starts none (no child process to clean up).

Known limits
------------
- Group -> client flow control is per stream (streams.py, "Flow control per stream"):
  the gateway grants each stream what its client read, and the group's primary stops
  reading that stream's app socket STREAM_WINDOW_BYTES beyond the last grant, so a
  client that reads slowly holds up its own reply only, and the gateway holds at most
  about a window of it. MAX_CLIENT_BACKLOG_BYTES stays as a guard (a client whose unread
  replies exceed it is dropped), which a group that honours the grants never reaches.
- Client -> group likewise: the group's primary grants what its app took of each
  stream, and the gateway reads no more of a client than STREAM_WINDOW_BYTES beyond
  the last grant; an upload to an app that reads slowly waits in the client's TCP.
- The gateway itself is not replicated: if it dies, its clients' TCP connections die
  with it (a restarted gateway is a new member with a new group connection); the
  group frees the dead gateway's connection when a gateway with its id starts, or after
  remote_timeout_ms of silence (above).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass

from llft.runtime.application import batch_scheduling, raise_fd_limit
from llft.runtime import config as cluster_config
from llft.runtime import logs, marks, profiling, stalls
from llft.runtime import status as status_files
from llft.runtime.driver import Driver
from llft.runtime.outbox import Outbox
from llft.runtime.sockets import LeanServer, StreamSocket, read_buffer
from llft.runtime.tasks import TaskSet
from llft.protocol.messages import Role
from llft.protocol.messaging import Closed, Deliver, Freed, MessagingEndpoint, Opened
from llft.protocol.messaging.lane import LanedEndpoint
from llft.protocol.messaging.native_lane import native_available, native_engine
from llft.protocol.streams import (Credit, FrameDecoder, FrameError, Kind, StreamTable,
                                   data_frames, frame, window_frame, window_value)
from llft.runtime.transport import Endpoint

log = logging.getLogger("llft.runtime.gateway")

STATUS_INTERVAL_S = 0.5
MAX_CLIENT_BACKLOG_BYTES = 32 << 20     # unread replies before a client is dropped
CONN_SEQ_BITS = 40
IDLE_CLOSE_S = 1.0                      # no stream open this long: the group connection closes
EXIT_TASK_FAILED = 70                   # a background task failed (EX_SOFTWARE)


class GatewayError(Exception):
    """A fault the gateway reports as one line and exit status 2."""


@dataclass
class Client:
    stream: int                         # its stream in the group connection
    sock: "ClientSocket"                # its connection (`sock.transport`)
    peer: str
    closed: bool = False                # nothing more is written to the client
    client_done: bool = False           # the client's stream ended (FIN/RST framed)
    # sent: the client's bytes framed into the group; handed: the group's bytes given to
    # the client's socket
    credit: Credit = dataclasses.field(default_factory=Credit)
    grant_came: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @property
    def transport(self) -> asyncio.Transport:
        return self.sock.transport


class ClientSocket(StreamSocket):
    """One accepted client (llft/runtime/sockets.py): its bytes are framed into the group
    connection as they are read (`Gateway._client_data`). A failure in the gateway's
    handling of one client drops that client; the others stay."""

    def __init__(self, gw: "Gateway"):
        super().__init__(gw.read_buf)
        self.gw = gw
        self.cl: Client | None = None

    def _call(self, name: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:   # noqa: BLE001 -- a bug: this client goes, the others stay
            self.gw.counters["client_handler_errors"] += 1
            log.exception("client %s: unexpected error (%s); disconnecting the client",
                          self.cl.stream if self.cl else "?", name)
            if self.cl is not None:
                self.gw._drop(self.cl, "error")
            elif self.transport is not None:
                self.transport.close()

    def _spawn(self, coro, name: str) -> asyncio.Task:
        return self.gw._client_task(coro)

    def made(self) -> None:
        self.gw._client_connected(self)

    def data(self, data: bytes) -> None:
        self.gw._client_data(self, data)

    def ended_by(self, abort: bool) -> None:
        self.gw._client_ended(self, abort)

    def writable_again(self) -> None:
        if self.cl is not None:
            self.gw._grant(self.cl)     # the client read its replies down: grant that


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise GatewayError(f"--listen {text!r}: expected HOST:PORT (PORT 0 picks a free one)")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def gateway_instance(listen: tuple[str, int]) -> str:
    """The instance part of this gateway's group id: the same for a gateway restarted on
    the same host and listening address (it then answers CLOSED on its predecessor's
    connection at once), different for any other gateway of the group (clients on
    several hosts each run one); random for a port picked by the system (0)."""
    host, port = listen
    if port == 0:
        return secrets.token_hex(8)
    where = f"{socket.gethostname()}|{host}|{port}".encode()
    return hashlib.blake2b(where, digest_size=8).hexdigest()


class Gateway:
    def __init__(self, cfg: cluster_config.ClusterConfig, group: str, key: bytes,
                 listen: tuple[str, int]):
        self.cfg = cfg
        self.group = group
        self.gcfg = cfg.group(group)
        self.key = key
        self.listen = listen
        self.birth = secrets.randbits(63) or 1
        self.conn_seq = secrets.randbits(CONN_SEQ_BITS)
        self.gateway_group = self.gcfg.gateway_group(gateway_instance(listen))
        self.endpoint = Endpoint(key, self.gateway_group, lambda m: None,
                                 groups=cfg.group_map(), interface=cfg.interface,
                                 ttl=cfg.ttl, birth_id=self.birth)
        # it opens its group connections and accepts none: a connection of a previous
        # incarnation of this gateway (killed, restarted) is answered CLOSED, not taken up
        self.core = MessagingEndpoint(self.gateway_group, self.birth, dataclasses.replace(
            cfg.messaging_config(self.endpoint.encoder.mtu_bytes), accepts_connections=False))
        # its steady group connection runs on a lane (llft/protocol/messaging/lane.py):
        # the C engine on raw datagrams when it is built (LLFT_LANE=python: the model,
        # off: the core alone)
        lane = cluster_config.lane_setting(native_available(), unbuilt="python")
        if lane == "native":
            self.core = LanedEndpoint(self.core, engine=native_engine(
                key, self.endpoint.encoder.mtu_bytes, materialize=False))
        elif lane != "off":
            self.core = LanedEndpoint(self.core)
        self.lane_kind = lane
        self.driver = Driver(self.endpoint, self.core, on_action=self._on_action)
        # the group connection: every client is a stream in it (opened by the first
        # client, closed when idle: `_open_conn`, `_close_if_idle`)
        self.conn = (group, self.conn_seq, Role.CLIENT)
        self.conn_open = False
        self.streams = StreamTable(remote_opens=False)
        self.decoder = FrameDecoder()
        self.next_offset = 0                # the group's byte stream: next offset expected
        self._idle_close: asyncio.TimerHandle | None = None
        self.outbox = Outbox(self.driver, self._send, spawn=self._spawn,
                             in_flight=lambda: self.core.in_flight(self.conn))
        self.clients: dict[int, Client] = {}
        self.counters: Counter[str] = Counter()
        self.tasks: set[asyncio.Task] = set()
        self.read_buf = read_buffer()       # every ClientSocket's reads (copied out at once)
        self.server: LeanServer | None = None
        self.bound: tuple[str, int] | None = None
        self.status_path = os.path.join(cfg.status_dir(group), f"gateway-{os.getpid()}.json")
        self.status_file = status_files.StatusFile()
        self.background = TaskSet(log, self._task_failed)
        self.stop_event: asyncio.Event | None = None
        self.exit_code = 0
        self.started = time.time()
        self._status_warned = False
        self._broken = False                # the group's byte stream broke the frame rules

    def _spawn(self, coro, name: str) -> asyncio.Task:
        return self.background.spawn(coro, name)

    def _client_task(self, coro) -> asyncio.Task:
        """A task of one client's (its reset, its paused reading): cancelled with the
        others when the gateway stops (`tasks`)."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _send(self, view: memoryview) -> int:
        return self.driver.call(self.core.send, self.conn, view, self.driver.clock_us())

    def _open_conn(self) -> None:
        """A client comes and no group connection is open: the next one opens."""
        if self.streams.opened:             # not the first: a fresh number, fresh state
            self.conn_seq = (self.conn_seq + 1) % (1 << CONN_SEQ_BITS)
            self.conn = (self.group, self.conn_seq, Role.CLIENT)
            self.streams = StreamTable(remote_opens=False)
            self.decoder = FrameDecoder()
            self.next_offset = 0
        self.core.open(*self.conn)
        self.conn_open = True
        self.counters["group_conns_opened"] += 1

    def _close_if_idle(self) -> None:
        """IDLE_CLOSE_S after the last stream was freed: if none opened since, our end
        of the group connection goes (after anything still queued); the group frees it."""
        self._idle_close = None
        if (self.conn_open and not self.streams.open and self.outbox.empty
                and not self._broken):
            self.driver.call(self.core.close, self.conn, False, self.driver.clock_us())
            self.conn_open = False
            self.counters["group_conns_closed_idle"] += 1

    # -- group -> clients ---------------------------------------------------------------
    def _on_action(self, action) -> None:
        if isinstance(action, Deliver):
            if action.conn == self.conn and self.conn_open:
                self._deliver(action)
            else:
                self.counters["orphan_bytes"] += len(action.data)
        elif isinstance(action, Closed):
            self.counters["group_conn_ends"] += 1
            if action.conn == self.conn:        # (not one we closed when idle)
                # the group ended the whole connection: no stream hears from it again
                for st in self.streams.end_all_in():
                    self._stream_end(st.id, Kind.RST)
        elif isinstance(action, Freed):
            self.counters["group_conns_freed"] += 1
        elif isinstance(action, Opened):
            # nobody should open a connection towards a gateway
            self.counters["unexpected_opens"] += 1
        else:
            self.counters[f"action_{type(action).__name__}"] += 1

    def _deliver(self, d: Deliver) -> None:
        """The group's byte stream, de-duplicated by offset, cut into frames."""
        data = d.data
        end = d.offset + len(data)
        if end <= self.next_offset:
            self.counters["duplicate_bytes"] += len(data)
            self.counters["duplicate_deliveries"] += 1
            return
        if d.offset > self.next_offset or self._broken:
            if not self._broken:
                self.counters["gaps"] += 1
                self._break(f"group bytes {d.offset}..{end} arrived but {self.next_offset} "
                            "was expected next (a gap: a bug)")
            return
        if d.offset < self.next_offset:
            skip = self.next_offset - d.offset
            self.counters["duplicate_bytes"] += skip
            self.counters["duplicate_deliveries"] += 1
            data = data[skip:]
        self.next_offset = end
        try:
            frames = self.decoder.feed(data)
            for f in frames:
                st, _ = self.streams.on_frame(f)
                if f.kind is Kind.DATA:
                    self._to_client(f.stream, f.payload)
                elif f.kind is Kind.WINDOW:
                    self.counters["windows_in"] += 1
                    cl = self.clients.get(f.stream)
                    if st is not None and cl is not None:
                        cl.credit.on_window(window_value(f))
                        cl.grant_came.set()
                else:
                    self._stream_end(f.stream, f.kind)
        except FrameError as e:
            self._break(f"the group's stream broke the frame rules: {e}")

    def _break(self, why: str) -> None:
        """The group's byte stream cannot be trusted from here on (a bug on one side):
        every client is reset rather than given a corrupt stream, and the group
        connection is aborted."""
        self._broken = True
        self.counters["broken_group_stream"] += 1
        log.error("%s; resetting every client", why)
        for cl in list(self.clients.values()):
            self._drop(cl, "broken")
        self.driver.call(self.core.close, self.conn, True, self.driver.clock_us())

    def _to_client(self, stream: int, data: bytes) -> None:
        cl = self.clients.get(stream)
        if cl is None or cl.closed or cl.transport.is_closing():
            self.counters["orphan_bytes"] += len(data)
            return
        if not data:
            return
        transport = cl.transport
        transport.write(data)
        cl.credit.handed += len(data)
        self.counters["bytes_out"] += len(data)
        if transport.get_write_buffer_size() > MAX_CLIENT_BACKLOG_BYTES:
            log.warning("client %d (%s) does not read its replies "
                        "(%d bytes pending): disconnecting it", cl.stream, cl.peer,
                        transport.get_write_buffer_size())
            self._drop(cl, "slow")
        else:
            self._grant(cl)

    def _grant(self, cl: Client) -> None:
        """Tell the group how much of the client's stream the client took (a WINDOW
        frame, every GRANT_STEP_BYTES): the group's primary sends at most
        STREAM_WINDOW_BYTES beyond it (streams.py). While the client's socket holds
        more than its transport's high-water mark, the grant waits until the client read
        it down (ClientSocket.writable_again); below the mark the grant at each write
        suffices (the window exceeds the mark by more than a step, so a group waiting
        for a grant always gets one)."""
        if not cl.credit.grant_due:
            return                      # no grant due; the group is a window from waiting
        st = self.streams.open.get(cl.stream)
        if cl.closed or st is None or st.end_in is not None or self._broken:
            return                      # nothing more of the group's side to pace
        consumed = cl.credit.grant(cl.transport.get_write_buffer_size())
        if consumed is not None:
            self.counters["windows_out"] += 1
            self.outbox.put(window_frame(cl.stream, consumed))

    def _out_of_credit(self, cl: Client) -> bool:
        """The group's app has not taken what the client sent beyond a window past the
        group's last grant: read no more of this client (its TCP backs up) until a grant
        comes. Not once the group's side of the stream ended (its app closed it: no grant
        follows; what the client still sends goes to the group as before)."""
        st = self.streams.open.get(cl.stream)
        return st is not None and st.end_in is None and cl.credit.blocked

    def _stream_end(self, stream: int, kind: Kind) -> None:
        """The group's side of a client's stream ended after its last byte: a FIN (the
        app closed or shut down its side), or a reset."""
        cl = self.clients.get(stream)
        if cl is not None:
            cl.grant_came.set()             # a reader waiting for a grant reads on
        if cl is None or cl.closed or cl.transport.is_closing():
            self.counters["orphan_ends"] += 1
        elif kind is Kind.RST:
            self.counters["resets_out"] += 1
            cl.closed = True
            self._client_task(self._reset_client(cl))
        else:
            self.counters["fins_out"] += 1
            try:
                if cl.transport.can_write_eof():
                    cl.transport.write_eof()    # after the bytes still buffered
            except OSError:
                self.counters["eof_to_gone_client"] += 1
        self._free_if_done(stream)

    def _free_if_done(self, stream: int) -> None:
        """Both ends of the stream passed: nothing of it is left here."""
        st = self.streams.open.get(stream)
        if st is None or not st.done:
            return
        self.streams.free(stream)
        self.counters["connections_freed"] += 1
        cl = self.clients.pop(stream, None)
        if cl is not None and not cl.closed:
            cl.closed = True
            cl.transport.close()            # after the bytes (and FIN) still buffered
        if not self.streams.open and self._idle_close is None and self.conn_open:
            self._idle_close = asyncio.get_running_loop().call_later(
                IDLE_CLOSE_S, self._close_if_idle)

    async def _reset_client(self, cl: Client) -> None:
        """A reset after every byte before it: the client's socket gets them all, then
        a RST (SO_LINGER 0)."""
        await cl.sock.reset_after_flush()

    def _drop(self, cl: Client, why: str) -> None:
        """The gateway gives up on a client (a client that does not read, the gateway
        stopping, a broken group stream): its socket closes and the group sees a reset."""
        if cl.closed and cl.client_done:
            return
        cl.closed = True
        cl.grant_came.set()                 # a reader waiting for a grant stops
        self.counters[f"clients_dropped_{why}"] += 1
        self._end_client_stream(cl, Kind.RST)
        try:
            cl.transport.close()
        except Exception:   # noqa: BLE001 -- already broken
            pass

    def _end_client_stream(self, cl: Client, kind: Kind) -> None:
        """The client's side ends here, in order after its last byte."""
        if cl.client_done:
            return
        cl.client_done = True
        self.counters["resets_in" if kind is Kind.RST else "fins_in"] += 1
        if not self._broken:
            self.streams.ended_out(cl.stream, kind)
            self.outbox.put(frame(kind, cl.stream))
        else:
            self.streams.open.pop(cl.stream, None)
            self.clients.pop(cl.stream, None)
            return
        self._free_if_done(cl.stream)

    # -- clients -> group ---------------------------------------------------------------
    def _accept_failed(self, exc: OSError) -> None:
        """Out of descriptors (or memory): accepting pauses a second (LeanServer)."""
        if not self.counters["accept_waits"]:
            log.warning("clients wait: cannot accept (%s); raise the open-files limit",
                        exc.strerror or exc)
        self.counters["accept_waits"] += 1

    def _client_connected(self, sock: ClientSocket) -> None:
        transport = sock.transport
        peer = transport.get_extra_info("peername")
        peer_s = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if self._broken:
            transport.close()
            return
        if self._idle_close is not None:
            self._idle_close.cancel()
            self._idle_close = None
        if not self.conn_open:
            self._open_conn()
        st = self.streams.open_next()
        cl = sock.cl = Client(st.id, sock, peer_s)
        self.clients[st.id] = cl
        self.counters["clients_total"] += 1
        self.outbox.put(frame(Kind.DATA, st.id))    # opens the stream at the group now
        self._client_flow(cl)

    def _client_data(self, sock: ClientSocket, data: bytes) -> None:
        cl = sock.cl
        if cl is None:
            return
        if cl.closed or cl.client_done:
            # dropped, or reset by the group: the client's side ends here
            sock.transport.pause_reading()
            self._end_client_stream(cl, Kind.FIN)
            return
        cl.credit.sent += len(data)
        self.counters["bytes_in"] += len(data)
        self.outbox.put(b"".join(data_frames(cl.stream, data)))
        self._client_flow(cl)

    def _client_flow(self, cl: Client) -> None:
        """Read on only while the client reads its replies (backpressure: replies
        first), the group connection's outbox has room, and the stream has the group's
        credit; otherwise pause the client's socket until all three hold again."""
        if cl.sock.write_paused or not self.outbox.has_room or self._out_of_credit(cl):
            cl.sock.pause_reading_until(lambda: self._client_may_read(cl))

    async def _client_may_read(self, cl: Client) -> bool:
        while not cl.closed:
            await cl.sock.writable()
            await self.outbox.room()
            if self._out_of_credit(cl):
                self.counters["client_credit_waits"] += 1
                cl.grant_came.clear()
                await cl.grant_came.wait()
                continue
            if not cl.sock.write_paused:
                return True
        return False                    # dropped or reset meanwhile: it stays paused

    def _client_ended(self, sock: ClientSocket, abort: bool) -> None:
        """The client's FIN (EOF) or reset, or its connection went: its stream ends here
        (the connection stays until the group's end of the stream passes too)."""
        cl = sock.cl
        if cl is None:
            return
        self._end_client_stream(cl, Kind.RST if abort else Kind.FIN)
        if abort:
            cl.closed = True
            sock.transport.close()

    # -- status -------------------------------------------------------------------------
    def status(self) -> dict:
        c = self.counters
        return {
            "kind": "gateway", "group": self.group, "gateway_group": self.gateway_group,
            "pid": os.getpid(), "pid_start": status_files.own_start(), "birth": self.birth,
            "listen": list(self.bound or ()),
            "started": self.started, "updated": time.time(), "written_mono": time.monotonic(),
            # clients still sending (a client that half-closed waits for the group's end)
            "clients": sum(not cl.client_done for cl in self.clients.values()),
            "clients_total": c["clients_total"],
            "clients_refused": c["clients_refused"],
            "bytes_in": c["bytes_in"], "bytes_out": c["bytes_out"],
            "duplicate_bytes": c["duplicate_bytes"],
            "duplicate_deliveries": c["duplicate_deliveries"],
            "gaps": c["gaps"], "orphan_bytes": c["orphan_bytes"],
            "counters": dict(c), "connections": len(self.core.conns),
            # client streams open in the group connection, and since the start (in every
            # group connection: a stream per client, counted where it opens and is freed)
            "streams": {"open": len(self.streams.open), "opened": c["clients_total"],
                        "freed": c["connections_freed"]},
            "outbox_bytes": len(self.outbox.buf),
            "messaging": self.core.buffer_sizes(), "messaging_stats": dict(self.core.stats),
            "transport": self.endpoint.stats(),
            # events its lane handled, and the loans it took (none: LLFT_LANE=off)
            "lane": {"kind": self.lane_kind, "events": getattr(self.core, "lane_events", 0),
                     "loans": getattr(self.core, "loans", 0),
                     "reclaimed_for": dict(getattr(self.core, "reclaims", {}))},
        }

    def write_status(self) -> None:
        self.status_file.write(self.status_path, self.status())   # by a helper thread
        if self.status_file.errors and not self._status_warned:
            self._status_warned = True
            log.warning("cannot write status file %s: %s", self.status_path,
                        self.status_file.last_error)

    def remove_status(self) -> None:
        self.status_file.remove()               # after any write still pending
        self.status_file.close()
        try:
            os.unlink(f"{self.status_path}.tmp")
        except OSError:
            pass

    async def _status_loop(self) -> None:
        told = None
        while True:
            self.write_status()
            told = self._log_takeover(told)
            await asyncio.sleep(STATUS_INTERVAL_S)   # a reporting period, not a sync

    def _log_takeover(self, told):
        """A new primary of the group asked where its stream resumes (phase 2): one line
        with our answer, for reading a failover afterwards."""
        c = self.core.conns.get(self.conn)
        answer = c.remote_view.npv_answer if c is not None else None
        if answer is not None and answer != told:
            pvn, low, sent_to, delivered, held = answer
            log.warning("new primary of %s in view %d: its stream resumes at %d (we had "
                        "delivered %d), ours at %d; order info of the old primary we "
                        "reflected: %s", self.group, pvn, low, delivered, sent_to,
                        "none" if held is None else
                        f"view {held[0]} positions {held[1]}-{held[2]}")
        return answer

    def _task_failed(self, name: str, exc: BaseException) -> None:
        self.exit_code = EXIT_TASK_FAILED
        if self.stop_event is not None:
            self.stop_event.set()

    # -- life cycle ---------------------------------------------------------------------
    async def serve(self, out=None) -> int:
        out = out or sys.stdout
        loop = asyncio.get_running_loop()
        logs.install_loop_handler(loop, log)
        stalls.start_from_env(loop, log)
        profiling.start_from_env(loop, log, "gateway")
        marks.start_from_env(loop, log, "gateway")
        stop = self.stop_event = asyncio.Event()
        host, port = self.listen
        try:
            await self.endpoint.start()
        except OSError as e:
            raise GatewayError(f"cannot listen on the gateway's group address "
                               f"{self.gcfg.gateway_address.mcast_addr}:"
                               f"{self.gcfg.gateway_address.port}: {e.strerror or e}") from None
        try:
            self.core.set_view(1, self.birth, [(self.birth, 1)], self.birth,
                               now_us=self.driver.clock_us())
            self.driver.start()
            try:
                self.server = LeanServer(loop, lambda: ClientSocket(self), host, port,
                                         on_error=self._accept_failed)
            except OSError as e:
                raise GatewayError(f"cannot listen on {host}:{port}: "
                                   f"{e.strerror or e}") from None
            sock = self.server.sockets[0].getsockname()
            self.bound = (sock[0], sock[1])
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            self.write_status()
            await asyncio.to_thread(self.status_file.close)   # on disk before "ready"
            status_task = self.background.spawn(self._status_loop(), "status")
            print(json.dumps({"event": "ready", "listen": list(self.bound),
                              "group": self.group}), file=out, flush=True)
            await stop.wait()
            status_task.cancel()
            self.server.close()
            for cl in list(self.clients.values()):
                self._drop(cl, "shutdown")
            for t in list(self.tasks):
                t.cancel()
            if self.tasks:
                await asyncio.wait(list(self.tasks), timeout=2.0)
            # our end of the group connection, after the clients' resets (the group frees
            # the connection once its own end has passed too); bounded: a group that is
            # gone does not hold the gateway's exit
            if self._idle_close is not None:
                self._idle_close.cancel()
            if self.conn_open and await self.driver.wait_for(lambda: self.outbox.empty, 1.0):
                self.driver.call(self.core.close, self.conn, False, self.driver.clock_us())
                await self.driver.wait_for(lambda: not any(
                    self.core.buffer_sizes()[k] for k in ("sent", "queue")), 1.0)
            self.outbox.close()
            return self.exit_code
        finally:
            self.driver.stop()
            self.endpoint.close()
            self.remove_status()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="FILE", help="cluster configuration (TOML)")
    p.add_argument("--group", required=True, metavar="NAME", help="the group clients reach")
    p.add_argument("--listen", required=True, metavar="HOST:PORT",
                   help="where TCP clients connect (PORT 0: any free port)")
    p.add_argument("--verbose", action="store_true", help="log more on stderr")


def run(args) -> int:
    logs.setup(f"gw:{args.group}", logging.INFO if args.verbose else logging.WARNING)
    raise_fd_limit()                    # a connection per client, thousands at once
    batch_scheduling()                  # before any thread starts (application.py says why)
    try:
        cfg = cluster_config.load(args.config)
        cfg.group(args.group)
        key = cfg.load_key()
        cluster_config.check_interface(cfg)
        listen = parse_listen(args.listen)
        gw = Gateway(cfg, args.group, key, listen)
        return asyncio.run(gw.serve())
    except (cluster_config.ConfigError, GatewayError) as e:
        print(f"llft gateway: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="llft gateway", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
