"""`llft gateway`: carries plain TCP clients into a replicated group.

    llft gateway --config cluster.toml --group counter --listen 127.0.0.1:7000

Theory of operation
-------------------
Plain TCP clients cannot speak LLFT, so the gateway speaks it for them. The gateway is
a one-member LLFT group of its own: group id `<NAME>.gateway` (`GroupConfig.
gateway_group`), listening on the group's `gateway_address`, with a `MessagingEndpoint`
in a static view where it is the primary, alone (`set_view(1, birth, [(birth, 1)],
birth)`), driven by `llft.runtime.driver.Driver` over a `transport.Endpoint` (given its birth
id, so it drops its own multicast echoes). Addresses come from the configuration's
`group_map()`, the HMAC key from its key file.

Each accepted TCP client becomes one messaging connection to group NAME:
`open(NAME, conn_seq, Role.CLIENT)` with conn_seq = a random 40-bit base drawn when the
gateway starts + the client's number (1, 2, ...), so a restarted gateway never reuses a
connection the servers still remember from an earlier gateway.

- Client -> group: bytes read from the client go to `send()`, as much as `send_space()`
  admits; while messaging has no space the gateway stops reading from that client (TCP
  flow control pushes back on it) and waits on the driver's `progress` event.
- Group -> client: `Deliver` actions are written to the client, de-duplicated by stream
  offset: per connection the gateway keeps the next offset it expects, drops bytes below
  it (counted as duplicates: after a failover of the group's primary, messaging's phase 2
  may resend bytes the client already has) and treats bytes beyond it (a gap) as a bug:
  counted, logged, and the client is disconnected rather than given a corrupt stream.
  So each client sees every reply byte exactly once, across failovers.
- Ends: a client's FIN (EOF) or reset ends its stream into the group
  (`MessagingEndpoint.close`), ordered after its last byte: the app's recv returns 0
  (or fails with ECONNRESET) exactly there, at every replica. The group's end (`Closed`,
  after its last byte) becomes a FIN to the client (`write_eof`: a half-close; the
  client may still send) or a reset (SO_LINGER 0 once every byte is out). When both
  ends are in and acknowledged messaging frees the connection (`Freed`): the client's
  socket is closed and nothing of it is left here. The gateway dropping a client (a
  gap, a client that does not read, shutdown) is a reset into the group.
- Slow clients: the gateway reads a client's next request only after its pending replies
  drained below the writer's high-water mark (`drain()`), so a request/reply client that
  does not read cannot make the group produce unbounded output; a client whose unread
  replies still exceed `MAX_CLIENT_BACKLOG_BYTES` is disconnected.

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
- Open connections are bounded by messaging's `max_connections` (closed ones do not
  count); beyond it new clients are refused. Each open connection still has its own
  acks and timers (streams are not yet multiplexed in one group-pair connection:
  docs/ARCHITECTURE.md, open items).
- Many concurrent clients: each is its own messaging connection with its own acks,
  timers and FIRST_ACK/SECOND_ACK exchanges; on a loaded 2-core host 64 request/reply
  clients of a 3-replica group saturate the gateway and the agents (see
  docs/BENCHMARKS.md, `llft bench echo`, and docs/ARCHITECTURE.md, open item 1).
- The gateway itself is not replicated: if it dies, its clients' TCP connections die
  with it (a restarted gateway is a new member with new connections).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import signal
import socket
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass

from llft.runtime.application import raise_fd_limit
from llft.runtime import config as cluster_config
from llft.runtime import logs, stalls
from llft.runtime import status as status_files
from llft.runtime.driver import Driver
from llft.runtime.tasks import TaskSet
from llft.protocol.messages import Role
from llft.protocol.messaging import (BufferFull, Closed, Deliver, Freed, MessagingConfig,
                                     MessagingEndpoint, Opened)
from llft.runtime.transport import Endpoint

log = logging.getLogger("llft.runtime.gateway")

STATUS_INTERVAL_S = 0.5
READ_BYTES = 64 << 10
MAX_CLIENT_BACKLOG_BYTES = 32 << 20     # unread replies before a client is dropped
CONN_SEQ_BITS = 40
EXIT_TASK_FAILED = 70                   # a background task failed (EX_SOFTWARE)


class GatewayError(Exception):
    """A fault the gateway reports as one line and exit status 2."""


@dataclass
class Client:
    number: int
    conn: tuple
    writer: asyncio.StreamWriter
    peer: str
    next_offset: int = 0                # next reply byte offset the client expects
    closed: bool = False                # nothing more is written to the client
    client_done: bool = False           # the client's stream ended (FIN/RST sent in)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise GatewayError(f"--listen {text!r}: expected HOST:PORT (PORT 0 picks a free one)")
    return (host.strip("[]") or "0.0.0.0"), int(port)


class Gateway:
    def __init__(self, cfg: cluster_config.ClusterConfig, group: str, key: bytes,
                 listen: tuple[str, int]):
        self.cfg = cfg
        self.group = group
        self.gcfg = cfg.group(group)
        self.key = key
        self.listen = listen
        self.birth = secrets.randbits(63) or 1
        self.conn_base = secrets.randbits(CONN_SEQ_BITS)
        self.core = MessagingEndpoint(
            self.gcfg.gateway_group, self.birth,
            MessagingConfig(heartbeat_us=max(500, int(cfg.heartbeat_ms * 1000))))
        self.endpoint = Endpoint(key, self.gcfg.gateway_group, lambda m: None,
                                 groups=cfg.group_map(), interface=cfg.interface,
                                 ttl=cfg.ttl, birth_id=self.birth)
        self.driver = Driver(self.endpoint, self.core, on_action=self._on_action)
        self.clients: dict[tuple, Client] = {}
        self.counters: Counter[str] = Counter()
        self.next_number = 0
        self.tasks: set[asyncio.Task] = set()
        self.server: asyncio.AbstractServer | None = None
        self.bound: tuple[str, int] | None = None
        self.status_path = os.path.join(cfg.status_dir(group), f"gateway-{os.getpid()}.json")
        self.status_file = status_files.StatusFile()
        self.background = TaskSet(log, self._task_failed)
        self.stop_event: asyncio.Event | None = None
        self.exit_code = 0
        self.started = time.time()
        self._status_warned = False

    # -- group -> clients ---------------------------------------------------------------
    def _on_action(self, action) -> None:
        if isinstance(action, Deliver):
            self._deliver(action)
        elif isinstance(action, Closed):
            self._group_closed(action)
        elif isinstance(action, Freed):
            self.counters["connections_freed"] += 1
            cl = self.clients.pop(action.conn, None)
            if cl is not None and not cl.closed:
                cl.closed = True
                cl.writer.close()           # after the bytes (and FIN) still buffered
        elif isinstance(action, Opened):
            # nobody should open a connection towards a gateway
            self.counters["unexpected_opens"] += 1
        else:
            self.counters[f"action_{type(action).__name__}"] += 1

    def _deliver(self, d: Deliver) -> None:
        cl = self.clients.get(d.conn)
        if cl is None or cl.closed or cl.writer.is_closing():
            self.counters["orphan_bytes"] += len(d.data)
            return
        data = d.data
        end = d.offset + len(data)
        if end <= cl.next_offset:
            self.counters["duplicate_bytes"] += len(data)
            self.counters["duplicate_deliveries"] += 1
            return
        if d.offset > cl.next_offset:
            self.counters["gaps"] += 1
            log.error("client %d (%s): reply bytes %d..%d arrived but %d "
                      "was expected next (a gap: a bug); disconnecting the client",
                      cl.number, cl.peer, d.offset, end, cl.next_offset)
            self._drop(cl, "gap")
            return
        if d.offset < cl.next_offset:
            skip = cl.next_offset - d.offset
            self.counters["duplicate_bytes"] += skip
            self.counters["duplicate_deliveries"] += 1
            data = data[skip:]
        cl.writer.write(data)
        cl.next_offset = end
        self.counters["bytes_out"] += len(data)
        transport = cl.writer.transport
        if transport is not None and transport.get_write_buffer_size() > MAX_CLIENT_BACKLOG_BYTES:
            log.warning("client %d (%s) does not read its replies "
                        "(%d bytes pending): disconnecting it", cl.number, cl.peer,
                        transport.get_write_buffer_size())
            self._drop(cl, "slow")

    def _group_closed(self, a: Closed) -> None:
        """The group's stream to this client ended after its last byte: a FIN (the app
        closed or shut down its side), or a reset."""
        cl = self.clients.get(a.conn)
        if cl is None or cl.closed or cl.writer.is_closing():
            self.counters["orphan_ends"] += 1
            return
        if a.abort:
            self.counters["resets_out"] += 1
            cl.closed = True
            task = asyncio.ensure_future(self._reset_client(cl))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        else:
            self.counters["fins_out"] += 1
            try:
                if cl.writer.can_write_eof():
                    cl.writer.write_eof()   # after the bytes still buffered
            except OSError:
                self.counters["eof_to_gone_client"] += 1

    async def _reset_client(self, cl: Client) -> None:
        """A reset after every byte before it: the client's socket gets them all, then
        a RST (SO_LINGER 0)."""
        cl.writer.transport.set_write_buffer_limits(high=0)
        try:
            await cl.writer.drain()
        except ConnectionError:
            return
        sock = cl.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        cl.writer.transport.abort()

    def _drop(self, cl: Client, why: str) -> None:
        """The gateway gives up on a client (a gap, a client that does not read, the
        gateway stopping): its socket closes and the group sees a reset."""
        if cl.closed:
            return
        cl.closed = True
        self.clients.pop(cl.conn, None)
        self.counters[f"clients_dropped_{why}"] += 1
        if not cl.client_done:
            cl.client_done = True
            self.driver.call(self.core.close, cl.conn, True, self.driver.clock_us())
        try:
            cl.writer.close()
        except Exception:   # noqa: BLE001 -- already broken
            pass

    # -- clients -> group ---------------------------------------------------------------
    async def _handle_client(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.tasks.add(task)
        self.next_number += 1
        number = self.next_number
        peer = writer.get_extra_info("peername")
        peer_s = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        try:
            cid = self.driver.call(self.core.open, self.group, self.conn_base + number,
                                   Role.CLIENT)
        except BufferFull:
            self.counters["clients_refused"] += 1
            log.warning("refusing client %s: %d connections in use "
                        "(messaging's max_connections)", peer_s, len(self.core.conns))
            writer.close()
            self.tasks.discard(task)
            return
        cl = Client(number, cid, writer, peer_s)
        self.clients[cid] = cl
        self.counters["clients_total"] += 1
        abort = False
        try:
            while not cl.closed:
                await writer.drain()            # backpressure: replies first
                data = await reader.read(READ_BYTES)
                if not data:
                    break                       # FIN: the client sends nothing more
                self.counters["bytes_in"] += len(data)
                view = memoryview(data)
                while view and not cl.closed:
                    n = self.driver.call(self.core.send, cid, view, self.driver.clock_us())
                    view = view[n:]
                    if view:
                        self.counters["send_waits"] += 1
                        await self.driver.wait_for(
                            lambda: cl.closed or self.core.send_space(cid) > 0, 3600.0)
        except (ConnectionError, OSError):
            abort = True                        # the client reset its connection
        except asyncio.CancelledError:
            pass
        except Exception:   # noqa: BLE001 -- a bug: this client goes, the others stay
            self.counters["client_handler_errors"] += 1
            log.exception("client %d (%s): unexpected error; disconnecting the client",
                          number, peer_s)
            self._drop(cl, "error")
        finally:
            if not cl.client_done:
                # the client's stream ends here, in order after its last byte; the
                # connection stays until the group's stream ends too (then Freed)
                cl.client_done = True
                self.counters["resets_in" if abort else "fins_in"] += 1
                self.driver.call(self.core.close, cid, abort, self.driver.clock_us())
                if abort:
                    cl.closed = True
                    writer.close()
            self.tasks.discard(task)

    # -- status -------------------------------------------------------------------------
    def status(self) -> dict:
        c = self.counters
        return {
            "kind": "gateway", "group": self.group, "gateway_group": self.gcfg.gateway_group,
            "pid": os.getpid(), "birth": self.birth, "listen": list(self.bound or ()),
            "started": self.started, "updated": time.time(),
            # clients still sending (a client that half-closed waits for the group's end)
            "clients": sum(not cl.client_done for cl in self.clients.values()),
            "clients_total": c["clients_total"],
            "clients_refused": c["clients_refused"],
            "bytes_in": c["bytes_in"], "bytes_out": c["bytes_out"],
            "duplicate_bytes": c["duplicate_bytes"],
            "duplicate_deliveries": c["duplicate_deliveries"],
            "gaps": c["gaps"], "orphan_bytes": c["orphan_bytes"],
            "counters": dict(c), "connections": len(self.core.conns),
            "messaging": self.core.buffer_sizes(), "messaging_stats": dict(self.core.stats),
            "transport": self.endpoint.stats(),
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
        while True:
            self.write_status()
            await asyncio.sleep(STATUS_INTERVAL_S)   # a reporting period, not a sync

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
                self.server = await asyncio.start_server(self._handle_client, host, port,
                                                         reuse_address=True)
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
