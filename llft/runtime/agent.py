"""`llft run`: one replica of a group — the agent and the unmodified application it runs.

    llft run --config cluster.toml --group counter -- python examples/kv_counter.py 9000

Theory of operation
-------------------
The agent is one asyncio process (docs/DESIGN.md, "Processes of one replica"). It owns
a `ReplicaNode` (membership + messaging, llft/replica/node.py) driven by
`llft.runtime.driver.Driver` over real UDP multicast, and the application, started under
the preload shim (determinizer/runner.py) with a shared-memory block
(`determinizer.shm.Shm`).

Parts. The agent coordinates; each part is defined apart:
  the replica        read only through `ReplicaNode`'s public API; its actions are the
                     vocabulary of llft/replica/actions.py, dispatched by a table of
                     handlers here (`_action_handlers`; anything else raises)
  the application    `Application` (llft/runtime/application.py): spawn under the shim,
                     the shm block, the drain and feeder threads, promotion, kill; its
                     mode is an `AppMode` with written transitions
  the status file    `status.StatusFile` (atomic rewrites, removed at exit)
  here               group connections to the app, order-info framing, output commit,
                     the process's life (signals, exit status)

Group connections and their streams (docs/DESIGN.md, "Three kinds of connection" and
"A group connection carries streams"). A remote group (a gateway, another group) opens
one messaging connection to ours and carries every TCP connection of its side as a
*stream* inside it (llft/protocol/streams.py: DATA, FIN and RST frames). The app listens
on the group's `service_port`; the shim makes that listener a UNIX socket of its own name
and publishes it (`Shm.group_address`; the app still sees TCP). Each stream becomes one
real connection from the agent to it (an `AppConn`): the agent writes the stream's bytes and ends
as the frames deliver them, and frames what the app writes back into the group
connection's outbox (llft/runtime/outbox.py; the primary's output goes out, a backup's
is logged: semi-active). The shim orders accept/read/write on those sockets: a backup
accepts the same connections, reads the same byte counts and checks that it writes the
same bytes (divergence detector). A stream whose two ends passed is freed (its socket
closed once the app closed it too); the group connection stays, and its control
traffic does not grow with the streams. Credit per stream (streams.py): the remote's
WINDOW frames (what its client read) pace the primary's reading of that stream's app
socket (`_out_of_credit`), and the primary grants what its app's socket accepted
(`_grant_in`, framed like output); the stream's input goes to the app's socket 256 KB at
a time (`_feed_app`).

The primary's framing is order information. The frames of one group connection
interleave the streams in the order the primary's agent happened to read its app's
sockets; a backup's agent reads them at other moments, and after a failover the new
primary resends its log by offset of the group connection's byte stream, so every
replica must frame identical bytes. The primary therefore records each frame it makes
as an "F" entry, (stream k, bytes, or the end), in its order information before the
frame goes out (output commit: the entry rides on, or before, the message that carries
the frame); a backup frames its own app's output by those entries, in their order, as
its app produces it.

Order information. The agent frames its own entries inside the node's application
order-info chunks (the node adds its tag byte around them):

    b"S" + shim entries      whole entries drained from the shim's ring (<= MAX_OI_PIECE)
    b"C" + msgpack([k, remote_group, conn_seq, role, stream])
                             stream number k (0, 1, ...) is this stream of this
                             messaging connection
    b"F" + (k u32, n i64)*   frames the primary made, in order: n bytes of stream k's
                             app output, or its end (FRAME_FIN, FRAME_RST)

A primary registers a stream (a "C" entry) when its first frame is delivered, then
connects it to the app; every replica connects the streams in the order of the "C"
entries, so every app accepts them in the same order. A backup feeds "S" entries to its
shim (a thread: the feeder blocks while the app is behind), connects on "C" entries and
frames on "F" entries (llft/replica/framing.py, `Framer`: the rules and why a promoted
backup finishes its predecessor's frames before it frames live).

Output commit (docs/DESIGN.md, "Output commit"): before the primary hands the app's
output to messaging it drains the shim's ring, so every order-info entry the output
depends on is queued before the output (messaging piggybacks it on the data, the remote
primary reflects it). The drain watcher (a native thread) only says when entries wait
undrained; the loop alone drains, on the output path and when the watcher asks: entries
stay in the shim's order.

Roles over time (the application's `AppMode` in brackets):
  founder   first member: ViewSwitch(primary) -> app starts as PRIMARY   [NONE -> PRIMARY]
  joiner    StateRestored -> Restored(streams, order_info, app_state): the app starts as a
            BACKUP with the primary's environment, replays the group's whole log of inputs
            and order info (the checkpoint, see llft/replica/node.py), then follows live
                                                                        [NONE -> BACKUP]
  promoted  a backup whose view starts as primary: feeds what phase 2 recovered, waits
            until its app has executed every entry it was given, then `Shm.promote()`:
            the app continues live, and the agent starts draining
                                                   [BACKUP -> PROMOTING -> PRIMARY]
  reset     RestartApp: the app is killed; a new one starts at the next Restored
                                                   [a new Application, NONE]

The agent and the app live and die together: the app gets SIGKILL when the agent dies
(PR_SET_PDEATHSIG), and the agent exits with the app's status when the app ends.
SIGTERM: a backup says LEAVE and stops at once (its primary removes it without waiting
out its timeout); a primary whose successor (its senior backup) has not caught up since
it joined serves on until it has, at most `handoff_wait_s` (a second SIGTERM: at once),
so that a rolling restart does not make the clients wait for a joiner's replay
(`_hand_off`; it gives up once the successor's lag stops shrinking); then it waits
(bounded) until its backups hold all its order info, so the backup that takes over is
exactly where it was, and says LEAVE. An app that ends by itself (the OOM killer's SIGKILL, a crash, an exit) stops its replica the
same way: the group need not wait for its detector. Its sockets end before its exit
status can be read, and those ends are its death's, not closes it made
(`_app_closed`, `Application.dying`): framed, they reached every client. A child of the
app that this machine takes (a PySpark driver's JVM: the kernel's OOM killer, a kill the
app did not send) fails the replica too (`_watch_children`, `_failed_here`), if another
replica can take over: the app is stopped before anything it made of the death is
drained or sent, and the replica leaves (status 71).

No process left behind (llft/runtime/proctree.py): each app runs in a session of its
own; the agent is a child subreaper (orphaned descendants come back to it, and it reaps
them every ORPHAN_CHECK_S); a reset kills the old app's whole tree (a JVM, its workers);
leaving, the agent kills every descendant it has and waits until they are gone; and a
watchdog process, told each app's session (and every descendant that left it), kills
them when the agent dies without running any code (SIGKILL).

Background tasks (the connector, the status loop, a promotion, one reader per group
connection) belong to a `TaskSet`: a failure is logged with its traceback and stops the
replica (exit status 70), never "Task exception was never retrieved"; the loop's
exception handler logs anything else asyncio would print, with its context.

Logs (llft/runtime/logs.py): every line on stderr carries the UTC time and the replica's
short name, `<group>/<first 6 hex of the birth id>` (a reset changes it); view
changes, resets and promotions say why.

Status: every STATUS_PERIOD_S and at each change the agent writes
`<runtime_dir>/<group>/<birth>.json` (atomically), read by `llft status`.

Lag (docs/LOG.md). Every LAG_CHECK_S while entries move (and every LAG_IDLE_S while
none do: an idle agent is not woken 50 times a second for nothing) the lag task runs:
  at a backup   the shim's progress counter (entries the app completed) is turned into
                the order-info position the app executed (`_marks`: per position fed,
                the running count of shim entries up to it) and given to the node, which
                reports it to the primary on its ORDER_INFO acks. A joiner is
                `catching-up` until its app has executed the history it was restored
                with (and its own lag is within the bound), then `ready` (logged once,
                with the replay's duration: `llft bench join`).
  at a primary  `node.lag_hold`: while a ready backup is more than the bound behind,
                the agent holds the shim (`Shm.hold`: backpressure on ordering, the
                app's threads wait at their next ordered call, so the backups get
                nothing new to replay and the app produces no output) until the backup
                is back within the bound. Entries are stamped when drained, which is
                when the app made them: the app is held, not the drain. A backup that
                stays above the bound for the give-up time is released (logged): no
                longer held for until it has stayed within the bound as long.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import errno
import faulthandler
import logging
import os
import random
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgpack

from determinizer import orderinfo
from determinizer.grpcrelay import Relay, relay_env
from llft.protocol import messaging as mg
from llft.protocol.messages import Role
from llft.protocol.messaging.backup_lane import BackupLane
from llft.protocol.messaging.lane import LanedEndpoint
from llft.protocol.messaging.native_backup_lane import native_available, native_backup_engine
from llft.protocol.streams import Credit, FrameDecoder, FrameError, Kind, StreamTable, window_value
from llft.replica import actions
from llft.replica import node as rp
from llft.replica.framing import ENTRY as FRAME_ENTRY
from llft.replica.framing import Framer, Made
from llft.runtime import config as config_mod
from llft.runtime import keys
from llft.runtime import logs, marks, proctree, profiling, pulse, stalls
from llft.runtime import status as status_files
from llft.runtime.application import (AppMode, Application, batch_scheduling, own_session,
                                      raise_agent_priority, raise_fd_limit, role_priority)
from llft.runtime.driver import Driver
from llft.runtime.outbox import Outbox
from llft.runtime.sockets import (LeanTransport, StreamSocket, connect_at_once, connect_lean,
                                  read_buffer)
from llft.runtime.tasks import TaskSet
from llft.runtime.transport import Endpoint
from membership import core as mb

STATUS_PERIOD_S = 0.25
STATUS_IDLE_PERIOD_S = 1.0       # ... while the group carried nothing since the last one
MAX_OI_PIECE = 8 << 10           # order-info bytes per node chunk (entries kept whole)
# What an app socket's transport buffers at most; the rest of a stream's input waits in
# its AppConn.pending as the chunks it came in. asyncio keeps a transport's buffer in one
# bytearray, and a bytearray that shrank below half its size is copied whole: with
# hundreds of MB queued for an app that reads slowly, that copy held the loop (and the
# GIL) past the peers' fault timeout, and the backup took over from a live primary.
APP_WRITE_HIGH_BYTES = 256 << 10
APP_WRITE_LOW_BYTES = 64 << 10
# A backup delivers its input in batches (all that its primary's latest heartbeat covers:
# ~20 ms of requests, several per stream under load) and writes each stream's share of a
# batch to the app in one send of at most this much, once per loop turn (`_feed_later`)
APP_WRITE_JOIN_BYTES = 64 << 10
TERM_FLUSH_S = 1.0               # SIGTERM at a primary: wait this long for backups' acks
# SIGTERM at a primary whose successor is still catching up: how often it looks at the
# successor's lag report (`_hand_off`; how long at most: [cluster] handoff_wait_s)
HANDOFF_CHECK_S = 0.05
# ... and it gives up once the successor's lag has not shrunk for this long: a successor
# that replays no faster than the primary makes entries (a PySpark driver's jobs re-run on
# a busy machine) never catches up, and every second waited is another its takeover
# replays (`llft chaos --workload spark --kinds restart`: 60 s waited in vain, then a
# 50 s pause instead of 10 s)
HANDOFF_STALL_S = 5.0
PROMOTE_CHECK_S = 0.002          # how often a promoting agent checks the app's progress
TAG_SHIM, TAG_CONN, TAG_FRAME = b"S", b"C", b"F"
# said at a takeover (`_heard_since`): did the silent primary's heartbeats reach us?
HEARD_COUNTERS = ("pulse_received", "pulse_absorbed", "pulse_forwarded", "pulse_queue_full",
                  "accepted_HEARTBEAT", "received_datagrams")
FRAMING_WAIT_LOG_S = 5.0         # a promotion waiting this long for the app's output: logged
APP_STATE_VERSION = 1
EXIT_TASK_FAILED = 70            # a background task of the agent failed (EX_SOFTWARE)
EXIT_JOIN_REFUSED = 69           # the group admits no new replica (EX_UNAVAILABLE)
EXIT_APP_PROCESS_KILLED = 71     # this machine took a process of the app (EX_OSERR)
CHILD_EXIT_WAIT_S = 1.0          # a child of the app's that began its exit, before a drain
LOOP_HANG_S = 20.0               # the event loop silent this long: stacks to the log
SLOW_ACTION_MS = 30             # one node action handled this long is logged (heartbeats wait)
CONNECT_FD_RETRY_S = 0.05       # out of descriptors: retry a connection to the app this often
HISTORY_SLICE = 1000             # restored log entries handed to the app per loop turn
CONNECTS_PER_TURN = 8            # app connections made at once in one loop turn, at most
FOUNDING_GUARD_S = 0.02         # a joiner re-reads this host's status files (founding)
LAG_CHECK_S = 0.02               # backups report execution / the primary checks the bound
LAG_IDLE_S = 1.0                 # ... and this often while no entry is outstanding
CATCH_UP_WINDOW_S = 5.0          # a backup's execution rate is measured over this long
CATCH_UP_WAIT_MAX_S = 60.0       # longest wait its detector adds for its own replay

log = logging.getLogger("llft.run")


def _rss_kb() -> int | None:
    """This agent's resident memory (status: flat memory under many short connections)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return None


def _log(msg: str) -> None:
    log.info(msg)


StreamKey = tuple[str, int, Role, int]    # (remote group, conn_seq, role, stream)


@dataclass
class GroupConn:
    """One messaging connection from a remote group: its streams (llft/protocol/streams.py)
    and the outbox of what our app writes back into it."""
    cid: mg.ConnId
    outbox: Outbox
    streams: StreamTable = field(default_factory=lambda: StreamTable(remote_opens=True))
    decoder: FrameDecoder = field(default_factory=FrameDecoder)
    conns: dict[int, "AppConn"] = field(default_factory=dict)   # by stream id
    ended_in: bool = False           # the remote side ended the whole connection
    ending: bool = False             # our end of it goes once the outbox drained
    freed: bool = False              # messaging freed it
    broken: bool = False             # its frames broke the rules: nothing more is read


@dataclass
class AppConn:
    """One stream as the app sees it: a connection from us (a UNIX socket the app takes
    for TCP: native/shim_group.c)."""
    key: StreamKey
    gc: GroupConn
    index: int = -1                  # k of its "C" entry; -1 while unregistered
    # delivered, not yet handed to the app's socket: chunks as they came, never one big
    # buffer (see APP_WRITE_HIGH_BYTES)
    pending: collections.deque = field(default_factory=collections.deque)
    transport: asyncio.Transport | None = None  # the connected socket (an AppSocket's)
    end_passed: bool = False         # the remote side's end was handed to the socket
    feed_due: bool = False           # in the agent's list of streams to feed this turn
    # sent: the app's output read; handed: its input given to the app's socket
    credit: Credit = field(default_factory=Credit)
    grant_came: asyncio.Event = field(default_factory=asyncio.Event)  # a blocked reader waits
    end: bool | None = None          # the remote side's end passed: abort?  (None: not yet)
    app_end: bool | None = None      # the app closed its side (our reader saw it): abort?

    @property
    def stream(self) -> int:
        return self.key[3]


class AppSocket(StreamSocket):
    """The agent's end of one `AppConn` (llft/runtime/sockets.py): what the app writes is
    framed as it is read (`Agent._app_output`), input refilled as the app reads it
    (`Agent._feed_app`). A failure in any of these stops the replica as a failed task
    does (`TaskSet.call`): asyncio would close this one connection at this one replica,
    and the replicas would no longer do the same."""

    def __init__(self, agent: "Agent", app: Application, c: AppConn):
        super().__init__(agent._read_buf)
        self.agent, self.app, self.c = agent, app, c

    def _call(self, name: str, fn, *args) -> None:
        self.agent.tasks.call(f"app-conn-{name}", fn, *args)

    def _spawn(self, coro, name: str) -> asyncio.Task:
        return self.agent.tasks.spawn(coro, f"{name}-conn-{self.c.index}")

    def made(self) -> None:
        self.agent._app_connected(self)

    def data(self, data: bytes) -> None:
        self.agent._app_output(self, data)

    def ended_by(self, abort: bool) -> None:
        self.agent._app_closed(self.app, self.c, abort)

    def writable_again(self) -> None:
        self.agent._feed_app(self.c)


def backup_lane_wrapper(key: bytes, mtu_bytes: int) -> tuple[str, Callable | None]:
    """What runs a backup's steady events (docs/BACKUP_LANE.md), from `LLFT_LANE` as the
    gateway reads it: `native` (the default when built) the C engine on raw datagrams
    (native/lane/llft_backup.c), `python` its model (backup_lane.py: measured no cheaper
    than the core, kept to compare), `off` the core alone. A lone primary lends nothing
    here (the gateway's lane is the lone primary's). Returns (kind, wrapper)."""
    # (unbuilt: off -- the model costs as much as the core, no gain)
    kind = config_mod.lane_setting(native_available(), unbuilt="off")
    if kind == "off":
        return kind, None
    engine = native_backup_engine(key, mtu_bytes) if kind == "native" else BackupLane
    return kind, lambda core: LanedEndpoint(core, backup_engine=engine, lone=False)


class Agent:
    def __init__(self, cfg: config_mod.ClusterConfig, group: str, cmd: list[str]):
        self.cfg = cfg
        self.gcfg = cfg.group(group)
        self.group = group
        self.cmd = cmd
        self.key = cfg.load_key()
        hb = int(cfg.heartbeat_ms * 1000)
        base = int(cfg.fault_timeout_ms * 1000)
        # a lost proposal, acceptance or join request is sent again after at most 5 ms,
        # however rare the heartbeats (config.py: heartbeat_ms follows the timeout)
        resend = min(hb, 5_000)
        # every timeout is a floor that membership extends per peer by what its timing
        # showed (membership/detector.py), by at most 3 x base; a replica reset again
        # soon after a reset waits base/2 (50 ms by default), doubling up to 20 x base
        # (2 s), before it applies; 100 x base (10 s) as a member forgets the resets; a
        # joiner founds the group after 4 x base (400 ms) of silence, one that was reset
        # from the group after 40 x base (4 s: it is likelier cut off than alone)
        self.membership_config = mb.Config(
            group=group, heartbeat_interval_us=hb, timeout_base_us=base,
            backup_timeout_us=2 * base, ack_timeout_us=2 * base, retransmit_us=resend,
            join_retry_us=2 * resend, found_timeout_us=4 * base, refound_timeout_us=40 * base,
            adaptive_cap_us=3 * base, rejoin_backoff_min_us=base // 2,
            rejoin_backoff_max_us=20 * base, rejoin_stable_us=100 * base,
            host=socket.gethostname(), pid=os.getpid())
        self.endpoint = Endpoint(self.key, [group], lambda m: None,
                                 groups=cfg.group_map(), interface=cfg.interface,
                                 ttl=cfg.ttl, pulse=True)
        self.messaging_config = cfg.messaging_config(self.endpoint.encoder.mtu_bytes)
        self.rng = random.Random(os.getpid() ^ time.monotonic_ns())
        self.lane_kind, self.lane_wrapper = backup_lane_wrapper(
            self.key, self.endpoint.encoder.mtu_bytes)
        self.node = rp.ReplicaNode(group, self.rng, membership_config=self.membership_config,
                                   messaging_config=self.messaging_config, app_state=self,
                                   log_cap_bytes=cfg.log_cap_bytes,
                                   log_cap_entries=cfg.log_cap_entries,
                                   wrap_messaging=self.lane_wrapper)
        self.node.membership.wall_ms_of = lambda: time.time_ns() // 1_000_000  # (lineages)
        self.driver = Driver(self.endpoint, self.node, on_action=self._on_action)
        self._handlers = self._action_handlers()
        self.stop_event = asyncio.Event()
        self._joining = asyncio.Event()     # set while not a member: the founding guard's
        self._joining.set()
        self.exit_code = 0
        self.app_status: int | None = None  # the app's exit status, once it exited
        self.local_failure: str | None = None   # why this replica failed while alive
        self._children: proctree.ChildWatch | None = None   # the app's (`_watch_children`)
        self._child_news = 0                # the app's shim's child news seen (`_drain_order_info`)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LLFT_")}
        # the app's gRPC client channels are relayed (determinizer/grpcrelay/): the
        # primary's relay makes the calls, backups read its answers from the order info;
        # the port is the group's, so a promoted backup finds its own host's relay there
        # (`_relay_up` when our app becomes the primary, down with the app)
        self.relay_address = ("127.0.0.1", self.gcfg.grpc_relay_port)
        self.env = relay_env(self.env, self.relay_address)
        self.relay: Relay | None = None      # listening only while our app is the primary
        self._relay_stops: list[threading.Thread] = []
        self.cwd = os.getcwd()
        self._restored_app: dict | None = None
        self.tasks = TaskSet(log, self._task_failed)
        self.watchdog: proctree.Watchdog | None = None
        self._sessions: set[int] = set()      # app sessions whose trees are not gone yet
        self._connector_task: asyncio.Task | None = None
        self._view_reason: tuple[int, str] = (0, "")   # the last view formed as primary
        # what the transport had heard at the last status write (`_heard_since`)
        self._heard_mark: tuple[float, dict[str, int]] = (time.monotonic(), {})
        self._recovered_gaps = 0              # node's recovered_gap count already logged
        self._reset_app_state()
        self.counters: dict[str, int] = {}
        self.events: list[dict] = []          # role changes etc. (status file, bounded)
        self.started_mono = time.monotonic()
        self.status_file = status_files.StatusFile()

    def _reset_app_state(self) -> None:
        """A new (not yet started) application and no group connection to it."""
        self.app = Application(self.cmd, self.cwd, self.gcfg.service_port,
                               on_exit=self._app_exited,
                               on_order_info=self._take_order_info,
                               on_feed_failed=self._feed_failed,
                               on_spawn=self._app_spawned,
                               on_stopped=self._app_tree_gone,
                               on_commit_wanted=self._commit_wanted)
        self._commit_task: asyncio.Task | None = None
        self._commit_answered = 0             # the app's last external-send ticket answered
        self.group_conns: dict[mg.ConnId, GroupConn] = {}
        self.conns: dict[StreamKey, AppConn] = {}     # streams the app may still use
        self._read_buf = read_buffer()      # every AppSocket's reads (copied out at once)
        self.by_index: dict[int, AppConn] = {}        # ... registered ones, by their k
        self.registered = 0                   # "C" entries so far (the next index)
        self.unregistered: list[AppConn] = []  # primary: delivered on, no "C" yet
        self._to_feed: list[AppConn] = []     # backup: streams to feed this turn
        # streams the remote reset whose socket to the app stays until the app closes
        # it or, at a primary, until the framer made every entry of it (`_end_stream`)
        self._resets_due: dict[StreamKey, AppConn] = {}
        # the app's output, framed identically at every replica ("F" entries)
        self.framer = Framer()
        self._framing_wait_since = 0.0        # a promoted primary waits for its app's bytes
        self.streams_freed = 0
        self._connect_queue: asyncio.Queue = asyncio.Queue()
        self._connector_busy = False          # it took a connection it has not made yet
        self._connects_this_turn = 0          # app connections made in this loop turn
        self._oi_pending: list[bytes] = []    # drained, not yet accepted by messaging
        # backup: (pvn, pos, shim entries fed up to it, monotonic time it came) per
        # position not yet executed; positions executed are reported to the node
        self._marks: collections.deque = collections.deque()
        self._fed_total = 0                   # shim entries handed to this app
        self._history_entries = 0             # ... of them, the restored history
        # a joiner's restored log, handed to its app a slice per loop turn (a log of
        # hundreds of thousands of entries took the loop ~1 s in one go: the joiner went
        # silent and was removed, again at every rejoin); entries and view marks that
        # arrive meanwhile queue behind it, so the app sees the log's order
        self._history: collections.deque = collections.deque()
        self._founding_held: str | None = None   # why this joiner may not found
        self._progress: collections.deque = collections.deque()   # (mono, consumed)
        self._set_sync("none")                # backup: "catching-up" -> "ready"
        self._restored_mono = 0.0
        self._own_lag = {"entries": 0, "ms": 0.0}
        self._lag_held = False                # primary: backpressure on (see docstring)
        self._handing_off: int | None = None    # SIGTERM at a primary: the successor it
                                                # serves on for (`_stop_asked`)
        self._lag_work = asyncio.Event()      # entries moved: the lag task checks again
        self._promote_from = 0                # entries executed when promotion began
        self._held_since = 0.0

    def _set_sync(self, sync: str) -> None:
        """"none", "catching-up" or "ready": while catching up, membership waits longest
        on its peers (Membership.set_catching_up)."""
        self._sync = sync
        self.node.set_catching_up(sync == "catching-up")
        if sync == "none":
            self._progress.clear()
            self.node.set_catch_up_estimate(0, self.driver.clock_us())

    @property
    def mode(self) -> AppMode:
        return self.app.mode

    # ---- AppState (llft/replica/node.py): what a joining backup needs besides the log --------
    def checkpoint(self) -> bytes:
        return msgpack.packb({"v": APP_STATE_VERSION, "env": self.env, "cwd": self.cwd,
                              "cmd": self.cmd}, use_bin_type=True)

    def restore(self, data: bytes) -> None:
        blob = msgpack.unpackb(data, raw=False) if data else {}
        if blob and blob.get("v") != APP_STATE_VERSION:
            raise ValueError(f"application state version {blob.get('v')} unknown")
        self._restored_app = blob or None

    # ---- life cycle ------------------------------------------------------------------
    async def run(self) -> int:
        loop = self.loop = asyncio.get_running_loop()
        logs.install_loop_handler(loop, log)
        stalls.start_from_env(loop, log)
        profiling.start_from_env(loop, log, "agent")
        marks.start_from_env(loop, log, "agent")
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop_asked, signal.Signals(sig).name)
        proctree.become_subreaper()
        self.watchdog = proctree.Watchdog()
        try:
            await self.endpoint.start()
            self._guard_founding()              # before the founding timeout can run
            self.node.start(self.driver.clock_us())
            logs.set_name(logs.replica_name(self.group, self.node.birth))   # drawn at start
            self.endpoint.birth_id = self.node.birth    # our echoes dropped undecoded
            self.driver.start()
            self._start_connector()
            self.tasks.spawn(self._status_loop(), "status")
            self.tasks.spawn(self._lag_loop(), "lag")
            self.tasks.spawn(self._founding_guard_loop(), "founding-guard")
            _log(f"group {self.group}: birth {self.node.birth:x} joining "
                 f"({self.gcfg.address.mcast_addr}:{self.gcfg.address.port})")
            await self.stop_event.wait()
            if self.exit_code == 0 or self.app_status is not None or self.local_failure:
                # SIGTERM, or the app ended (an OOM kill of it, a crash) while this
                # agent is well: the backups get every order-info entry the app made
                # (not after a local failure: the app's reaction to it may be among them),
                if self.mode is AppMode.PRIMARY and not self.local_failure:
                    await self._flush_before_exit()
                # and a primary's senior backup takes over now, not after its detector;
                # a backup is removed now, not after its primary's timeout (membership)
                if self.driver.call(self.node.leave, self.driver.clock_us()):
                    self._count("left")
        finally:
            self.tasks.cancel_all()
            faulthandler.cancel_dump_traceback_later()
            stopped = self._stop_app()
            self.driver.stop()
            self.endpoint.close()       # the group moves on while the tree dies
            await asyncio.to_thread(self._leave_no_process, stopped)
            for t in self._relay_stops:
                await asyncio.to_thread(t.join)
        if self.app.divergence is None and self.local_failure is None:
            self.status_file.remove()
        # a diverged one stays behind, and one that failed here (`llft status`: departed)
        await asyncio.to_thread(self.status_file.close)
        return self.exit_code

    def _stop_asked(self, sig: str) -> None:
        """SIGTERM or SIGINT: stop, after a hand-off if this primary's successor is
        still catching up; a second signal stops at once."""
        if self._handing_off is not None or self.stop_event.is_set():
            self.stop_event.set()
            return
        behind = self._successor_behind()
        if behind is None:
            self.stop_event.set()
            return
        b, lag = behind
        how = (f"{lag['entries']} positions, {lag['ms']:.0f} ms behind"
               + ("; it replays older views' history first" if self._progress_unseen(lag)
                  else ""))
        _log(f"{sig}: the application serves on until backup {mb.short_id(b)}, which takes "
             f"over, has caught up ({how}; at most {self.cfg.handoff_wait_s:g} s; {sig} "
             f"again stops at once)")
        self._handing_off = b
        self._event("hand_off_begun", successor=f"{b:x}")    # (`llft status` shows it)
        self.tasks.spawn(self._hand_off(b), "hand-off")

    def _successor_behind(self) -> tuple[int, dict] | None:
        """This primary's successor (its senior backup) and its lag, while a takeover by
        it would wait for a replay: it has not replayed the state it joined with (a
        replica started a moment ago; membership knows: it waits for the state, gets
        it, or its heartbeats say it replays), or it has positions of this view left to
        execute and has not caught up since it joined (an idle group makes none that
        would make it `ready`); else None."""
        members = self.node.membership.members if self.node.live else ()
        if self.mode is not AppMode.PRIMARY or len(members) < 2:
            return None
        b = members[1].birth
        lag = self.node.backup_lag(self.driver.clock_us()).get(b)
        if lag is None:
            return None
        if self.node.membership.restoring(b):
            return b, lag
        return None if lag["ready"] or not lag["entries"] else (b, lag)

    def _progress_unseen(self, lag: dict) -> bool:
        """The successor replays older views' history (it has executed no position of
        this view, and the log holds older ones): its progress does not show in its lag,
        which counts this view's positions only."""
        pvn = self.node.pvn
        return not lag["executed"] and any(p < pvn and q for p, q in
                                           self.node.views_ended().items())

    async def _hand_off(self, b: int) -> None:
        """Serve on until backup `b` (the successor) has caught up, the successor is
        another (a view change), `handoff_wait_s` have passed, or a stop is asked again."""
        t0 = best_t = time.monotonic()
        best = None                             # the successor's least lag seen (entries)
        made0 = None                            # this view's positions when it began
        while True:
            now = time.monotonic()
            members = self.node.membership.members if self.node.live else ()
            behind = self._successor_behind()
            # its lag in positions, where that can show progress: not while it replays
            # older views' history, unless this view makes positions meanwhile (each
            # one more its takeover replays: the stall rule as for any lag)
            e = 0
            if behind is not None:
                lag = behind[1]
                made = lag["executed"] + lag["entries"]
                made0 = made if made0 is None else made0
                if made > made0 or not self._progress_unseen(lag):
                    e = lag["entries"]
            if len(members) < 2 or members[1].birth != b or self.mode is not AppMode.PRIMARY:
                why = "the successor is gone"
            elif behind is None:
                why = "the successor caught up"
            elif self.stop_event.is_set():
                why = "asked again"
            elif now - t0 >= self.cfg.handoff_wait_s:
                why = f"gave up after handoff_wait_s ({self.cfg.handoff_wait_s:g} s)"
            elif e and best is not None and e >= best \
                    and now - best_t >= HANDOFF_STALL_S:
                why = (f"the successor is not catching up ({e} positions behind, no closer "
                       f"in {HANDOFF_STALL_S:g} s)")
            else:
                # (waiting; with no lag that can show progress only handoff_wait_s
                # bounds it)
                if e and (best is None or e < best):
                    best, best_t = e, now
                await asyncio.sleep(HANDOFF_CHECK_S)
                continue
            break
        ms = (time.monotonic() - t0) * 1000
        self._count("handoff_ms", round(ms))
        _log(f"hand-off: {why} after {ms:.0f} ms; leaving")
        self._event("hand_off", ms=round(ms, 1), why=why)
        self.stop_event.set()

    def _leave_no_process(self, stopped) -> None:
        """Leaving (a helper thread): the app's tree is killed, then every other
        descendant of the agent (trees of apps reset earlier, orphans); the watchdog
        goes last."""
        stopped.wait()
        wd = self.watchdog.pid
        proctree.kill_tree(
            [p for p in proctree.descendants(os.getpid()) if p.pid != wd],
            list(self._sessions), exclude=[wd])
        self.watchdog.close()

    def _relay_up(self) -> None:
        """Our app becomes the primary: its gRPC calls need a relay on the group's port
        (replicas on one host share it, SO_REUSEPORT; only primaries listen, so a backup
        never takes a primary's connection)."""
        if self.relay is not None:
            return
        try:
            self.relay = Relay(self.relay_address[1], reuse_port=True,
                               spawning=proctree.spawning, started=proctree.own,
                               reaped=proctree.disown)
        except OSError as e:
            _log(f"warning: {e}: the application's gRPC calls will fail (set "
                 f"grpc_relay_port in [group.{self.group}])")

    def _stop_app(self):
        # Every descendant of the agent but the watchdog and the gRPC relay belongs to
        # this app's tree: one app lives at a time, and a reset stops the old one before
        # the new one starts (a daemon of the app that left its session is an orphan of
        # ours by now). The relay stops with the app (off the loop: it waits for its
        # process); queued connections are refused and the caller's client retries.
        relay, self.relay = self.relay, None
        exclude = [self.watchdog.pid] if self.watchdog else []
        if relay is not None:
            if relay.proc is not None:
                exclude.append(relay.proc.pid)
            t = threading.Thread(target=relay.stop, name="relay-stop", daemon=True)
            t.start()
            self._relay_stops = [x for x in self._relay_stops if x.is_alive()] + [t]
        stopped = self.app.stop(exclude=exclude, also=proctree.descendants(os.getpid()))
        for c in self.conns.values():
            if c.transport:
                c.transport.close()         # (its paused reading's wait goes with it)
        for gc in self.group_conns.values():
            gc.outbox.close()
        return stopped

    def _app_spawned(self, app: Application) -> None:
        if app is self.app and not app.closed:
            _log(f"application pid {app.proc.pid} started ({app.mode.value})")
        self._sessions.add(app.session)
        if self.watchdog is not None:
            self.watchdog.track_session(app.session, app.tmp,
                                        app.shm.path if app.shm is not None else None)

    def _app_tree_gone(self, sid: int | None) -> None:
        """An app's tree is gone (a helper thread calls this): its session needs no
        watching."""
        if sid is None:
            return
        if self.watchdog is not None:
            self.watchdog.untrack_session(sid)
        try:
            self.loop.call_soon_threadsafe(self._sessions.discard, sid)
        except RuntimeError:
            pass                        # the loop is closed: the agent has left

    def _task_failed(self, name: str, exc: BaseException) -> None:
        if not self.stop_event.is_set():
            log.error(f"this replica stops: its {name} task failed")
            self.exit_code = EXIT_TASK_FAILED
            self.stop_event.set()

    def _start_connector(self) -> None:
        """One connector per application: a reset starts a new one, so no connection of
        the old app is connected to the new one."""
        if self._connector_task is not None:
            self._connector_task.cancel()
        self._connector_task = self.tasks.spawn(self._connector(self.app, self._connect_queue),
                                                "connector")

    async def _flush_before_exit(self) -> None:
        """A primary leaving (SIGTERM, or its app ended): its backups must hold every
        order-info entry (and the app's output must be out) before it goes, so the next
        primary continues exactly where this one stopped. An app that ended makes no
        more: a record it had begun when killed stays uncommitted for ever, and what
        was committed before it is all there is."""
        self.app.stop_draining()
        self.app.owe_drain()
        self._take_order_info()
        ended = self.app_status is not None

        def flushed() -> bool:
            if not (ended or self.app.owed_drained()):
                self._take_order_info()     # no watcher any more: drain on each progress
            return ((ended or self.app.owed_drained()) and not self._oi_pending
                    and self.node.backups_hold_all_order_info())
        await self.driver.wait_for(flushed, TERM_FLUSH_S)

    def _count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def _event(self, what: str, **kw) -> None:
        ev = {"t": round(time.monotonic() - self.started_mono, 4), "mono": time.monotonic(),
              "event": what, **kw}
        self.events.append(ev)
        del self.events[:-50]
        self._write_status()

    # ---- node actions (the vocabulary of llft/replica/actions.py) ------------------------
    def _action_handlers(self) -> dict[type, Callable[[Any], None]]:
        def ignore(a) -> None:
            pass                        # the node acted on it; nothing for the agent
        handlers = {
            actions.Deliver: self._deliver,
            actions.OrderInfo: lambda a: self._in_order(self._handle_entry, a.chunk, a.pvn,
                                                        a.pos),
            actions.ViewSwitch: self._view_switch,
            actions.Restored: self._start_backup,
            actions.RestartApp: self._restart_app,
            actions.RecoveredOrderInfo: self._recovered_order_info,
            actions.MembershipChanged: self._membership_changed,
            actions.ViewEntered: lambda a: self._write_status(),
            actions.Opened: ignore,     # registered on its first delivery
            actions.Closed: self._group_closed,
            actions.Freed: self._group_freed,
            actions.Resynced: ignore, actions.Phase2Done: ignore,
            actions.BeginPhase2: ignore, actions.ViewStarted: ignore,
            actions.StateRestored: ignore,
            actions.Reset: self._rejoin_backoff,    # after RestartApp
            actions.JoinRefused: self._join_refused,
        }
        # every action the node emits but Send and Pulse (the driver's) has a handler
        missing = set(actions.ACTION_TYPES) - {actions.Send, actions.Pulse} - set(handlers)
        if missing:
            raise RuntimeError(f"no handler for node actions {sorted(t.__name__ for t in missing)}")
        return handlers

    def _on_action(self, a: actions.NodeAction) -> None:
        handler = self._handlers.get(type(a))
        if handler is None:
            raise TypeError(f"llft run: {a!r} is not a node action")
        t0 = time.monotonic()
        handler(a)
        if self.node.status in mb.MEMBER_STATUSES:
            self._joining.clear()
        else:
            self._joining.set()
        ms = (time.monotonic() - t0) * 1000
        if ms >= SLOW_ACTION_MS:        # the loop (and so the heartbeats) stood still
            self._count("slow_actions")
            log.info(f"handling {type(a).__name__} took {ms:.0f} ms")

    def _view_switch(self, a: actions.ViewSwitch) -> None:
        if a.primary:
            self._become_primary(a.pvn)
        else:
            self._in_order(self._mark, a.pvn, a.pos)   # the marker is executed in its turn
        self._event("view", pvn=a.pvn, primary=a.primary)

    def _membership_changed(self, a: actions.MembershipChanged) -> None:
        role = "primary" if a.my_rank == 1 else f"backup rank {a.my_rank}"
        _log(f"view {a.pvn}.{a.change}: {role} of {len(a.members)} "
             f"[{' '.join(mb.short_id(k.birth) for k in a.members)}]: "
             f"{a.reason or 'membership changed'}")
        if a.my_rank == 1 and a.pvn != self._view_reason[0]:
            self._view_reason = (a.pvn, a.reason)
            if (a.reason or "").startswith("took over"):
                _log(self._heard_since())
        self._write_status()

    def _heard_since(self) -> str:
        """What the transport heard since the last status write, for a takeover's log: a
        backup that takes over from a live primary (docs/RELIABILITY.md, the thawed
        backup) says whether its primary's heartbeats reached its sockets meanwhile."""
        at, before = self._heard_mark
        now = self._transport_stats()
        said = ", ".join(f"{k} +{now.get(k, 0) - before.get(k, 0)}" for k in HEARD_COUNTERS)
        return f"heard in the {(time.monotonic() - at) * 1000:.0f} ms before: {said}"

    def _transport_stats(self) -> dict[str, int]:
        return self.endpoint.stats() if not self.endpoint.closed else {}

    def _why_primary(self, pvn: int) -> str:
        """Why this replica became the primary of view `pvn` (what formed the view)."""
        v, reason = self._view_reason
        return reason if v == pvn and reason else "the view formed with it as primary"

    def _recovered_order_info(self, a: actions.RecoveredOrderInfo) -> None:
        # the node delivered what it could as OrderInfo; a gap is fatal to the app
        if self.node.stats.get("recovered_gap", 0) > self._recovered_gaps:
            self._recovered_gaps = self.node.stats["recovered_gap"]
            _log(f"order info of view {a.pvn} recovered from {a.first_pos}, beyond "
                 f"what was delivered ({self.node.order_info_delivered(a.pvn)}): "
                 "entries are missing")

    def _restart_app(self, a: actions.RestartApp) -> None:
        _log(f"reset ({a.reason}): birth {a.old_birth:x} -> {a.new_birth:x}; "
             "the application's process tree is killed; a new one starts when the "
             "state arrives")
        logs.set_name(logs.replica_name(self.group, a.new_birth))
        self.endpoint.birth_id = a.new_birth
        self._stop_app()
        self.status_file.remove()
        self._reset_app_state()
        self._start_connector()
        self._event("reset", reason=a.reason)

    def _rejoin_backoff(self, a: actions.Reset) -> None:
        if a.rejoin_after_us > 0:
            _log(f"reset again soon after the last one: applying for membership in "
                 f"{a.rejoin_after_us / 1000:.0f} ms (back-off)")

    def _join_refused(self, a: actions.JoinRefused) -> None:
        """Applying again cannot help (docs/LOG.md, "The log's cap"): one line, and stop."""
        if self.stop_event.is_set():
            return
        log.error(f"the primary {a.primary:x} of group {self.group} refuses this replica: "
                  f"{a.why}")
        self.exit_code = EXIT_JOIN_REFUSED
        self._event("join_refused", why=a.why)
        self.stop_event.set()

    # -- group connections and their streams --
    def _group_conn(self, cid: mg.ConnId) -> GroupConn:
        gc = self.group_conns.get(cid)
        if gc is None:
            gc = self.group_conns[cid] = GroupConn(cid, Outbox(
                self.driver, lambda view: self._send_out(cid, view), ready=self._output_ready,
                spawn=self.tasks.spawn, in_flight=lambda: self._output_in_flight(cid)))
        return gc

    def _output_in_flight(self, cid: mg.ConnId) -> int:
        """The outbox's Nagle rule asks this. A backup's output only goes to its log
        (nothing waits for it): it always takes the end of the loop turn, so what its app
        wrote on all streams in one turn is logged in one step."""
        if self.mode is not AppMode.PRIMARY:
            return 1
        return self.node.in_flight(cid)

    def _send_out(self, cid: mg.ConnId, view: memoryview) -> int:
        try:
            return self.driver.call(self.node.send, cid, view, self.driver.clock_us())
        except rp.NotReady:
            return 0                        # the outbox tries again on progress

    def _output_ready(self) -> bool:
        """Output commit at a primary: framed output goes to messaging only once every
        order-info entry before it (its "F" entry included) is in messaging and what the
        backups do not hold yet fits in the message's piggyback. A backup logs at once."""
        if self.mode is not AppMode.PRIMARY:
            return True
        if not self.app.owed_drained():
            self._drain_order_info()
            if not self.app.owed_drained():
                # a record reserved before this output is not committed yet: the
                # entries behind it wait in the ring (`Application.owe_drain`)
                self._count("output_waits_for_commits")
                return False
        self._push_order_info()
        return not self._oi_pending and not self.node.output_commit_holds()

    def _deliver(self, a: actions.Deliver) -> None:
        """The remote group's byte stream on a group connection: its frames, in order."""
        gc = self._group_conn(a.conn)
        self._count("delivered_bytes", len(a.data))
        if gc.broken:
            return
        try:
            for f in gc.decoder.feed(a.data):
                st, new = gc.streams.on_frame(f)
                if st is None:
                    continue                # a grant that crossed the stream's free
                c = self._stream_in(gc, st.id) if new else gc.conns[st.id]
                if f.kind is Kind.WINDOW:
                    self._on_window(c, window_value(f))
                elif f.kind is Kind.DATA:
                    if f.payload:
                        c.pending.append(f.payload)
                        if self.mode is AppMode.PRIMARY:
                            self._feed_app(c)       # a client waits for it
                        else:
                            self._feed_later(c)
                else:
                    self._remote_end(c, f.kind is Kind.RST)
        except FrameError as e:
            self._broken(gc, str(e))
        if self.mode is AppMode.PRIMARY:
            self._register_new()

    def _on_window(self, c: AppConn, consumed: int) -> None:
        """The remote's consumer took `consumed` bytes of the app's output on `c`: the
        primary may read that much more of it (streams.STREAM_WINDOW_BYTES). Every
        replica keeps the grants, delivered in the same order, for when it is primary."""
        c.credit.on_window(consumed)
        c.grant_came.set()

    def _out_of_credit(self, c: AppConn) -> bool:
        """A primary reads no more of a stream whose remote grants and has not taken
        what was sent beyond its last grant; the app's send then blocks as on a plain
        TCP connection. A stream reset by the remote is read to its end."""
        return self.mode is AppMode.PRIMARY and c.end is not True and c.credit.blocked

    def _broken(self, gc: GroupConn, why: str) -> None:
        """A remote group's frames broke the rules (a bug there; they are authenticated):
        nothing more of that connection reaches the app. Its streams stay as they are."""
        gc.broken = True
        self._count("broken_group_conns")
        log.error(f"group connection {gc.cid}: {why}: its further bytes are ignored")

    def _stream_in(self, gc: GroupConn, sid: int) -> AppConn:
        key = (*gc.cid, sid)
        c = self.conns.get(key)
        if c is None:
            c = self.conns[key] = AppConn(key, gc)
            if self.mode is AppMode.PRIMARY:
                self.unregistered.append(c)
        gc.conns[sid] = c
        return c

    def _remote_end(self, c: AppConn, abort: bool) -> None:
        """The remote side of a stream ended after its last byte: the app's recv returns
        0 there (a FIN), or the connection is reset (at every replica: the shim orders
        it)."""
        c.end = abort
        self._count("stream_resets_in" if abort else "stream_fins_in")
        self._feed_app(c)
        if abort:
            c.grant_came.set()              # its reader, waiting for a grant, reads on
        self._stream_progress(c)
        if abort and c.index >= 0:
            self._made(*self.framer.remote_reset(c.index))  # by length once the app ends

    def _group_closed(self, a: actions.Closed) -> None:
        """The remote group ended the whole connection: every stream it had not ended
        is reset (in stream order, at every replica)."""
        self._group_ended_in(self._group_conn(a.conn))

    def _group_ended_in(self, gc: GroupConn) -> None:
        gc.ended_in = True
        self._count("group_conns_ended")
        for st in gc.streams.end_all_in():
            self._remote_end(gc.conns[st.id], True)
        self._maybe_end_group_conn(gc)

    def _group_freed(self, a: actions.Freed) -> None:
        gc = self.group_conns.get(a.conn)
        if gc is not None:
            gc.freed = True
            self._count("group_conns_freed")
            if gc.streams.open and not gc.ended_in:
                # freed with streams still open: the remote group lost the connection and
                # our primary took that as its reset (messaging `_on_closed`); a backup
                # learns it from the free and resets the same streams
                self._group_ended_in(gc)
            self._release_group_conn(gc)

    def _feed_later(self, c: AppConn) -> None:
        """At a backup: hand `c`'s input to the app at the end of this loop turn, with
        whatever else of it the turn delivers. A backup's input comes in batches (each
        rise of its primary's group watermark releases ~20 ms of requests), and a
        stream's requests of one batch then cost one send and one wake-up of the app's
        reader instead of one each. Nobody waits on a backup's app for them: the
        shim replays the primary's reads by their recorded lengths, whatever the sends."""
        if c.feed_due:
            return
        c.feed_due = True
        self._to_feed.append(c)
        if len(self._to_feed) == 1:
            self.loop.call_soon(self._feed_due)

    def _feed_due(self) -> None:
        todo, self._to_feed = self._to_feed, []
        for c in todo:
            c.feed_due = False
            self._feed_app(c)

    def _feed_app(self, c: AppConn) -> None:
        """Hand the stream's pending input to the app's socket, up to the transport's
        high-water mark (refilled as the app reads), then the remote side's end after
        the last byte. Chunks queued together go in one send (up to
        APP_WRITE_JOIN_BYTES)."""
        transport = c.transport
        if transport is None or transport.is_closing():
            return
        pending = c.pending
        while pending and transport.get_write_buffer_size() <= APP_WRITE_HIGH_BYTES:
            chunk = pending.popleft()
            if pending and len(chunk) < APP_WRITE_JOIN_BYTES:
                parts, size = [chunk], len(chunk)
                while pending and size + len(pending[0]) <= APP_WRITE_JOIN_BYTES:
                    parts.append(pending.popleft())
                    size += len(parts[-1])
                chunk = b"".join(parts)
                self._count("app_chunks_joined", len(parts) - 1)
            transport.write(chunk)
            self._count("app_writes")
            c.credit.handed += len(chunk)
        self._grant_in(c)
        # what is left waits for the transport's resume_writing (AppSocket): the app
        # read its buffer down to APP_WRITE_LOW_BYTES
        if not c.pending and c.end is not None and not c.end_passed:
            c.end_passed = True
            self._end_stream(c)

    def _grant_in(self, c: AppConn) -> None:
        """At the primary: tell the remote how much of the stream the app took (what its
        socket accepted), every GRANT_STEP_BYTES, so the remote sends at most
        STREAM_WINDOW_BYTES beyond it (streams.py). The grant is framed like output
        (an entry, then the WINDOW frame), so every replica's byte stream has it at the
        same place. Checked at each hand-off to the socket: below its high-water mark
        that suffices (the window exceeds the mark by more than a step), above it the
        refill after the app read it down checks again."""
        if (not c.credit.grant_due or self.mode is not AppMode.PRIMARY or c.transport is None
                or c.index < 0 or c.end is not None):
            return                          # no grant due, or nothing more to pace
        consumed = c.credit.grant(c.transport.get_write_buffer_size())
        if consumed is not None:
            self._count("windows_out")
            self._made(*self.framer.window(c.index, consumed))

    def _end_stream(self, c: AppConn) -> None:
        if not c.end:
            try:
                if not c.transport.is_closing() and c.transport.can_write_eof():
                    c.transport.write_eof()        # after the bytes still buffered
            except OSError:
                self._count("eof_to_closed_app_conn")   # the app reset it meanwhile
            return
        self._resets_due[c.key] = c
        self._reset_when_due()

    def _reset_when_due(self) -> None:
        """The app's socket of a stream the remote reset is reset (its read of it then
        fails as after a TCP RST) only by a primary, and only once its framer made every
        entry of that stream: the primary may have framed bytes of it before the reset
        reached it, which the remote may have read before it reset, and a backup's app
        that lags still has to write them; a backup's app reads the reset where its
        primary's did anyway (the shim replays that read) and then closes the socket.
        (Reset at delivery, a lagging backup promoted there framed those bytes by
        length: zeros, which the remote's lagging backups read. tests/sim/regressions/
        replica_recent_joiner_takes_over_at_a_leave_wrong_bytes.)"""
        if self.mode is not AppMode.PRIMARY:
            return
        for key, c in list(self._resets_due.items()):
            if c.index < 0 or not self.framer.owes(c.index):
                del self._resets_due[key]
                if c.transport is not None and not c.transport.is_closing():
                    self.tasks.spawn(self._reset_app_conn(c), f"reset-conn-{c.index}")

    async def _reset_app_conn(self, c: AppConn) -> None:
        """A reset after every byte before it: the app's recv fails with ECONNRESET once
        its socket has them all."""
        sock = c.transport.get_protocol()
        await sock.reset_after_flush(lambda: sock.app.reset_conn(c.index))

    def _stream_progress(self, c: AppConn) -> None:
        """After an end of `c` passed: a stream both of whose ends passed is freed (the
        same at every replica); the app's socket goes once the app closed it too."""
        gc = c.gc
        st = gc.streams.open.get(c.stream)
        if st is not None and st.done:
            gc.streams.free(c.stream)
            self.streams_freed += 1
            self._count("connections_freed")
        self._release_if_done(c)
        self._maybe_end_group_conn(gc)

    def _release_if_done(self, c: AppConn) -> None:
        """The stream was freed and the app closed its socket: nothing of it is left."""
        gc = c.gc
        if c.stream in gc.streams.open or c.app_end is None or self.conns.get(c.key) is not c:
            return
        del self.conns[c.key]
        gc.conns.pop(c.stream, None)
        if c.index >= 0:
            self.app.forget_app_reset(c.index)
        if self.by_index.get(c.index) is c:
            del self.by_index[c.index]
            self.framer.forget(c.index)
        if self._resets_due.pop(c.key, None) is not None:
            # (a backup's: every byte the app wrote is read, and a half-closed app that
            # reads on after a promotion reads the reset, not an end)
            self.tasks.spawn(self._reset_app_conn(c), f"reset-conn-{c.index}")
        elif c.transport is not None and c.end is not True:
            c.transport.close()     # (a reset one: its reset is under way or done)
        if gc.freed:
            self._release_group_conn(gc)

    def _maybe_end_group_conn(self, gc: GroupConn) -> None:
        """The remote side ended the connection and every stream in it is freed: our end
        follows, after the last frame (the same offset at every replica); messaging then
        frees the connection at both sides."""
        if gc.ended_in and not gc.streams.open and not gc.ending:
            gc.ending = True
            gc.outbox.finish(lambda: self._close_group_conn(gc))

    def _close_group_conn(self, gc: GroupConn) -> None:
        try:
            self.driver.call(self.node.close, gc.cid, False, self.driver.clock_us())
        except rp.NotReady:
            self._count("close_not_ready")

    def _release_group_conn(self, gc: GroupConn) -> None:
        if gc.freed and not gc.conns and self.group_conns.get(gc.cid) is gc:
            del self.group_conns[gc.cid]
            gc.outbox.close()

    def _register_new(self) -> None:
        """Primary: give every stream delivered on a "C" entry, in delivery order."""
        while self.unregistered:
            c = self.unregistered[0]
            k = self.registered
            remote, seq, role, stream = c.key
            entry = TAG_CONN + msgpack.packb([k, remote, seq, int(role), stream])
            try:
                self.node.add_order_info(entry, self.driver.clock_us())
            except (rp.NotReady, mg.BufferFull):
                return                    # retried at the view start / on progress
            self.unregistered.pop(0)
            self._registered(c, k)

    def _registered(self, c: AppConn, k: int) -> None:
        if k != self.registered:
            raise RuntimeError(f"connection {k} registered out of order "
                               f"(expected {self.registered})")
        c.index = k
        self.by_index[k] = c
        self.framer.add(k, c.gc.cid, c.stream)
        self.registered += 1
        if c.end is True:
            # its reset was delivered before its "C" entry (at a backup data and order
            # info travel apart; at a primary in the same delivery): the framer learns
            # it now, as `_remote_end` tells it of a registered stream
            self._made(*self.framer.remote_reset(k))
        self._connect_app(c)

    # -- order info at a backup --
    def _handle_entry(self, chunk: bytes, pvn: int, pos: int) -> None:
        tag, body = chunk[:1], chunk[1:]
        if tag == TAG_SHIM:
            self.app.feed(body)
            self._fed_total += orderinfo.split(body)[0]
            self._count("oi_entries_in", 1)
            self._mark(pvn, pos)
        elif tag == TAG_CONN:
            k, remote, seq, role, stream = msgpack.unpackb(body)
            role = Role(role)
            gc = self._group_conn((remote, seq, role))
            gc.streams.learn(stream)    # registered before its first frame reached us?
            c = self.conns.get((remote, seq, role, stream))
            if c is None:
                c = self._stream_in(gc, stream)
            if c.index < 0:
                self._registered(c, k)
            self._mark(pvn, pos)
        elif tag == TAG_FRAME and len(body) % FRAME_ENTRY.size == 0:
            self._made(*self.framer.entries(body))
            self._mark(pvn, pos)
        else:
            self._count("bad_agent_entry")

    # -- the application's life --
    def _app_exited(self, app: Application, rc: int) -> None:
        if app is not self.app or self.stop_event.is_set():
            return                              # a killed old app (reset) or shutdown
        if app.diverged:
            self._diverged()
            return
        if app.spawn_error is not None:
            log.error(f"cannot start the application {shlex.join(self.cmd)}: "
                      f"{app.spawn_error}: this replica stops")
        else:
            _log(f"the application exited with status {rc}: this replica stops")
        self.exit_code = rc if rc > 0 else (128 - rc if rc < 0 else 0)
        self.app_status = rc
        self._event("app_exit", status=rc)
        self.stop_event.set()

    def _watch_children(self, deep: bool = True) -> None:
        """Watch the app's descendants (a PySpark driver's JVM, a helper it runs) for a
        death this machine caused: the kernel's OOM killer, a kill from outside the app
        (proctree.ChildWatch); once a second, from the status loop, and at the
        primary before a drain when the shim has news of a child (not `deep`: new
        children only, descendants already watched stay so). A child told to stop from
        outside (a JVM given SIGTERM runs its shutdown first) is judged now."""
        app = self.app
        if app.closed or app.main_pid <= 0:
            return
        w = self._children
        if w is None or w.pid != app.main_pid:
            if w is not None:                   # a reset app's
                for fd in w.fds.values():
                    self.loop.remove_reader(fd)
                w.close()
            w = self._children = proctree.ChildWatch(app.main_pid, notes=app.shm)
        for pid, fd in w.scan(deep):
            self.loop.add_reader(fd, self._child_exited, app, w, pid)
        self.counters["children_watched"] = len(w.fds)
        self.counters["children_kills_unsure"] = w.unsure   # (this app's watch: proctree)
        for pid, by in w.stopped_from_outside():
            self._child_lost(app, pid, proctree.comm(pid) or w.names.get(pid, "?"), by,
                             "stopped")                 # (it may have exec'd)
        # those reaped (by the app, or by a program of it: a launcher its grandchild)
        # before they were watched, or before their end could be read
        for pid, by in w.reaped_unwatched():
            self._child_lost(app, pid, "?", by)

    def _child_exited(self, app: Application, w: proctree.ChildWatch, pid: int) -> None:
        if pid not in w.fds:
            return                              # (seen already, by a drain's poll)
        self.loop.remove_reader(w.fds[pid])
        self._count("children_ended")
        name = proctree.comm(pid) or w.names.get(pid, "?")     # (it may have exec'd)
        by = w.failure(pid)                     # (watched no more)
        self.counters["children_watched"] = len(w.fds)
        self._child_lost(app, pid, name, by)

    def _child_lost(self, app: Application, pid: int, name: str, by: str | None,
                    how: str = "killed") -> None:
        """Child `pid` of `app` died (or was told to stop: `how`), taken by `by` (this
        machine), or by its app or itself (None)."""
        if by is None or app is not self.app or app.closed or self.stop_event.is_set():
            return
        why = f"{by} {how} process {pid} ({name}) of the application"
        if len(self.node.membership.members) < 2:
            # nobody to take over: the app sees it, as it would without llft
            self._count("children_lost_alone")
            log.warning(f"{why}; no other replica to take over: the application goes on")
            return
        self._failed_here(why)

    def _failed_here(self, why: str) -> None:
        """This replica failed, though its agent and app live: a process of the app
        (a PySpark driver's JVM) was taken by this machine. The app's reaction to it
        (failed calls, closed connections) must not leave this replica: a takeover
        would repeat it at every replica. So the app is stopped now (nothing more of it
        is read, drained or sent), and the replica leaves without handing its backups
        what was not drained yet; the backup that takes over holds only what came
        before, and its own process serves on."""
        log.error(f"{why}: this replica stops (its backups take over)")
        self.local_failure = why
        self.exit_code = EXIT_APP_PROCESS_KILLED
        self._event("local_failure", why=why)
        self._stop_app()
        self.stop_event.set()

    def _become_primary(self, pvn: int) -> None:
        role_priority(primary=True)         # before the promotion's replay
        if self.mode is AppMode.NONE:
            self._relay_up()
            self.framer.primary = True
            self.app.start_primary(self.env)
            _log(f"primary of view {pvn} (founder): {self._why_primary(pvn)}")
        elif self.mode is AppMode.BACKUP:
            self._promote_from = self.app.consumed_entries or 0
            self.app.begin_promotion()
            self.tasks.spawn(self._promote(pvn, self.app), f"promote-view-{pvn}")

    async def _promote(self, pvn: int, app: Application) -> None:
        """`app` executes its last entries, then continues live. A reset (or the agent
        stopping) meanwhile closes `app`: the promotion is then a no-op, and the app
        is never touched again (its block is unmapped)."""
        t0 = time.monotonic()
        while True:
            if self.app is not app or app.closed or self.stop_event.is_set():
                return                              # reset or stopping
            if app.diverged:
                return                              # the status loop reports it
            if app.caught_up() and not self._history:
                break
            await asyncio.sleep(PROMOTE_CHECK_S)   # the app executes its last entries
        self._relay_up()
        app.promote()
        for c in self.conns.values():              # delivered on, never registered
            if c.index < 0:
                self.unregistered.append(c)
        self._register_new()
        self._made(*self.framer.promote())  # live once the predecessor's frames are made
        self._reset_when_due()
        for c in list(self.conns.values()):    # what our app took may be past the grants
            self._grant_in(c)
        ms = (time.monotonic() - t0) * 1000
        replayed = (app.fed_entries or 0) - self._promote_from
        st = self.node.stats
        _log(f"primary of view {pvn}: application promoted after {ms:.1f} ms "
             f"({replayed} entries replayed since the view change, {app.fed_entries} in "
             f"all; the views before ended at {self.node.views_ended()}; recovered from "
             f"remote groups so far: {st.get('recovered_entries', 0)}, catch-up entries "
             f"sent: {st.get('catch_up_sent', 0)}): {self._why_primary(pvn)}")
        self._marks.clear()
        self._set_sync("none")
        self._event("promoted", pvn=pvn, wait_ms=round(ms, 3), replayed=replayed,
                    fed=app.fed_entries)

    def _start_backup(self, a: actions.Restored) -> None:
        role_priority(primary=False)
        app = self._restored_app or {}
        env = dict(app.get("env") or self.env)
        self.app.start_backup(env)
        streams = dict(a.streams)
        # the group connections' input since the start: their streams, pending for the app
        for cid, data in streams.items():
            self._deliver(actions.Deliver(cid, 0, data))
        for cid, _abort in a.ends:
            self._group_closed(actions.Closed(cid, 0, _abort))
        self._history.extend((self._handle_entry, (chunk, pvn, pos))
                             for pvn, pos, chunk in a.order_info)
        # the state's last position of this view may be no entry of the app's (a view
        # begins with its primary's marker, which a joiner admitted after it gets only
        # as part of the state): executed once the app has replayed all before it, or
        # the primary would see this joiner one position behind until the next comes
        pvn = self.node.pvn
        upto = dict(a.log_upto).get(pvn, 0)
        if upto > max((p for v, p, _ in a.order_info if v == pvn), default=0):
            self._history.append((self._mark, (pvn, upto)))
        self._history_entries = sys.maxsize   # not "ready" before the whole log is fed
        self._set_sync("catching-up")
        self._restored_mono = time.monotonic()
        self.tasks.spawn(self._hand_over_history(self.app, len(a.order_info),
                                                 sum(len(d) for d in streams.values())),
                         "history")

    def _in_order(self, handle: Callable[..., None], *args) -> None:
        """An entry or a view mark: now, or behind the restored history still queued."""
        if self._history:
            self._history.append((handle, args))
        else:
            handle(*args)

    async def _hand_over_history(self, app: Application, chunks: int,
                                 input_bytes: int) -> None:
        """Feeds the restored log to `app` a slice per loop turn, so that the agent goes
        on answering heartbeats; what arrived meanwhile follows in its order."""
        history, left = self._history, chunks
        if left == 0:       # joined before the group's first entry: nothing to catch up on
            self._history_entries = self._fed_total
        while history:
            if self.app is not app or app.closed or self.stop_event.is_set():
                return                          # reset or stopping: a new app, a new log
            for _ in range(min(HISTORY_SLICE, len(history))):
                handle, args = history.popleft()
                handle(*args)
                left -= 1
                if left == 0:
                    self._history_entries = self._fed_total     # the restored part
            await asyncio.sleep(0)              # a loop turn: heartbeats, acks, datagrams
        if self.app is not app:
            return
        if left > 0:
            self._history_entries = self._fed_total
        _log(f"backup (rank {self.node.rank}) of view {self.node.pvn}: replaying "
             f"{chunks} order-info chunks ({self._history_entries} entries) and "
             f"{input_bytes} input bytes; catching up")
        self._event("restored", chunks=chunks, entries=self._history_entries)

    def _feed_failed(self, app: Application, why: str) -> None:
        if app is not self.app:
            return                                  # an app that was reset
        if app.diverged:
            self._diverged()
        elif not self.stop_event.is_set():
            log.error(f"feeding order info failed: {why}")
            self.exit_code = 3
            self.stop_event.set()

    def _diverged(self) -> None:
        if self.app.divergence is not None:
            return
        divergence = self.app.record_divergence()
        log.error("DIVERGENCE: the application did not do what the primary did: "
             + divergence["report"].replace("\n", " | "))
        self.exit_code = 86
        self._event("diverged", **divergence)
        self.stop_event.set()

    # -- order info at the primary --
    def _take_order_info(self) -> None:
        """Move drained entries into messaging (loop thread). Output commit: called
        before app output is handed to messaging."""
        if self._drain_order_info():
            self._push_order_info()

    def _drain_order_info(self) -> bool:
        """The shim's entries so far onto the pending list (into messaging later);
        False where nothing is drained (no shim, or not the primary)."""
        if self.app.shm is None or self.mode is not AppMode.PRIMARY:
            return False
        # a child's death first, so that none of what the app made of it is drained
        news = self.app.shm.child_news
        scanned = news != self._child_news
        if scanned:
            # the app met the end of a private connection or pipe, or reaped a child: a
            # child younger than the last scan may have died (a JVM just started); or a
            # program of it received a signal that may stop it
            self._child_news = news
            self._count("children_scans_early")
            self._watch_children(deep=False)
        w = self._children
        if w is not None and w.pid == self.app.main_pid:     # (not a reset app's)
            # (the children reaped unwatched: judged by the scan) then one that may be
            # this machine's doing (the OOM killer, a kill from outside), waited for
            # (its sockets closed before it ends) and judged; a child's other exits may
            # take long (a big heap's release) and are no failure
            for pid in w.dying() if w.fds and not self.app.closed else ():
                if w.may_fail(pid):
                    w.wait_exit(pid, CHILD_EXIT_WAIT_S)
                    self._child_exited(self.app, w, pid)
            if self.app.closed:
                return False
        owed = not self.app.owed_drained()
        data = self.app.drain()
        if owed and self.app.owed_drained():
            self.driver.progress.set()  # output waiting for it may go (`_output_ready`)
        if data:
            self._lag_work.set()
            # the drain copies whole entries only: a drain that fits one piece is not
            # walked entry by entry (17 entries a connection, 2 % of a primary's time)
            self._oi_pending.extend(
                [TAG_SHIM + data] if len(data) <= MAX_OI_PIECE
                else (TAG_SHIM + p for p in orderinfo.pieces(data, MAX_OI_PIECE)))
        return True

    def _push_order_info(self) -> None:
        """Entries drained or framed so far go to messaging, as far as it takes them."""
        if not self._oi_pending:
            return
        now = self.driver.clock_us()
        while self._oi_pending:
            try:
                self.node.add_order_info(self._oi_pending[0], now)
            except (rp.NotReady, mg.BufferFull):
                self._count("oi_backpressure")
                break
            self._count("oi_chunks_out")
            self._oi_pending.pop(0)
        self.driver.pump()

    # ---- connections to the app ------------------------------------------------------
    def _connect_app(self, c: AppConn) -> None:
        """Connect `c` to the app after every connection registered before it. When
        the connector has none waiting and the loopback handshake completes inside
        connect(), that is done in a callback of the next loop turn (the connector's
        queue and task step cost ~15 µs a connection at each replica), a few a turn;
        otherwise, and once any is waiting, the connector takes it, in order, as many
        a turn. A joiner registers its history's thousands of connections at once: all
        connected in one turn, they kept its loop from its heartbeats for ~300 ms and
        the primary removed it (`llft chaos --workload http --seed 2101`)."""
        asyncio.get_running_loop().call_soon(self._connect_soon, self.app, c)

    def _connect_soon(self, app: Application, c: AppConn) -> None:
        if app is not self.app:
            return                          # reset meanwhile: nothing goes to the new app
        where = app.group_address
        if (where is not None and not self._connector_busy and self._connect_queue.empty()
                and self._connects_this_turn < CONNECTS_PER_TURN):
            try:
                sock = connect_at_once(where)
            except OSError:                 # out of descriptors: the connector waits
                sock = None
            if sock is not None:
                LeanTransport(asyncio.get_running_loop(), sock, AppSocket(self, app, c))
                self._connected()
                return
        self._connect_queue.put_nowait(c)

    def _connected(self) -> None:
        """Count a connection made in this loop turn."""
        if not self._connects_this_turn:
            asyncio.get_running_loop().call_soon(self._next_turn)
        self._connects_this_turn += 1
        self._count("connections")
        if self._connects_this_turn > self.counters.get("connects_in_a_turn_max", 0):
            self.counters["connects_in_a_turn_max"] = self._connects_this_turn

    def _next_turn(self) -> None:
        self._connects_this_turn = 0

    async def _connector(self, app: Application, queue: asyncio.Queue) -> None:
        """Connects registered connections to `app`, one at a time, in index order
        (the app's accept queue is FIFO: every replica's app accepts them in this order)."""
        while True:
            self._connector_busy = False
            c: AppConn = await queue.get()
            self._connector_busy = True
            if self._connects_this_turn >= CONNECTS_PER_TURN:
                await asyncio.sleep(0)      # the next turn: heartbeats, datagrams
            where = None
            while where is None:
                where = app.group_address
                if where is None:
                    await asyncio.sleep(0.005)     # the app has not listened yet
            loop = asyncio.get_running_loop()
            # AppSocket.connection_made hands it its input (`_app_connected`)
            made = lambda: AppSocket(self, app, c)      # noqa: E731
            while True:
                try:
                    await connect_lean(loop, where, made)
                    break
                except OSError as e:
                    if e.errno not in (errno.EMFILE, errno.ENFILE):
                        if app is not self.app or app.closed or app.dying():
                            return          # its listener went with it: its exit stops us
                        raise
                    # out of descriptors (the hard limit): the app's closes free them
                    if not self.counters.get("connect_fd_waits"):
                        _log(f"connections to the application wait for file descriptors "
                             f"({e.strerror}; raise the open-files limit)")
                    self._count("connect_fd_waits")
                    await asyncio.sleep(CONNECT_FD_RETRY_S)
            self._connected()

    def _app_connected(self, sock: AppSocket) -> None:
        app, c, transport = sock.app, sock.c, sock.transport
        if app is not self.app or app.closed:
            transport.close()               # a reset app: nothing goes to it
            return
        transport.set_write_buffer_limits(high=APP_WRITE_HIGH_BYTES, low=APP_WRITE_LOW_BYTES)
        c.transport = transport
        self._feed_app(c)

    def _app_output(self, sock: AppSocket, data: bytes) -> None:
        """What the app wrote on `sock` (its AppConn), as read: framed. Reading pauses
        while the group connection's outbox is full or, at a primary, the stream is out
        of the remote's credit."""
        app, c = sock.app, sock.c
        if app is not self.app or app.closed:
            sock.transport.pause_reading()  # a reset app's output goes nowhere
            return
        c.credit.sent += len(data)
        self._made(*self.framer.output(c.index, data))
        if not c.gc.outbox.has_room or self._out_of_credit(c):
            sock.pause_reading_until(lambda: self._app_may_read(c))

    async def _app_may_read(self, c: AppConn) -> bool:
        while True:
            await c.gc.outbox.room()    # the group connection's flow control
            if not self._out_of_credit(c):  # the stream's own (the remote's grants)
                return True
            self._count("stream_credit_waits")
            c.grant_came.clear()
            await c.grant_came.wait()

    def _made(self, records: bytes, made: list[Made]) -> None:
        """What the framer made (llft/replica/framing.py). At a primary its "F" entries
        go to the order information first, after the shim's entries this output depends
        on (output commit: the outbox gives a frame to messaging only once everything
        before it is there and the unprotected order info fits a piggyback); then each
        frame goes to its connection's outbox, and an end ends our side of the stream.
        The entries go to messaging when the outbox pushes (`_output_ready`), which
        under load is once per loop turn: the F entries of the outputs read in one turn
        then make one piece (messaging took each read's apart: ~1 add_order_info and a
        pump per read at 16 clients)."""
        if records:
            if self.mode is AppMode.PRIMARY:
                self.app.owe_drain()    # what the app recorded before it, all of it
            self._drain_order_info()
            if self.app.closed:
                return                  # it failed here (`_failed_here`): nothing goes
            last = self._oi_pending[-1] if self._oi_pending else b""
            if last[:1] == TAG_FRAME and len(last) < MAX_OI_PIECE:
                self._oi_pending[-1] = last + records
            else:
                self._oi_pending.append(TAG_FRAME + records)
            if not made or self.mode is not AppMode.PRIMARY:
                self._push_order_info()     # no outbox push will take them
            self._count("frames_out", len(records) // FRAME_ENTRY.size)
        if self._resets_due and made:
            self._reset_when_due()          # a promoted primary made what they waited for
        for m in made:
            gc = self.group_conns.get(m.conn)
            if gc is None:
                self._count("frames_of_a_gone_connection")
                continue
            gc.outbox.put(m.frames)
            if m.end is not None:
                try:
                    gc.streams.ended_out(m.sid, m.end)
                except (FrameError, KeyError):
                    self._count("bad_frame_end")
                    continue
                c = gc.conns.get(m.sid)
                if c is not None:
                    self._stream_progress(c)

    def _app_closed(self, app: Application, c: AppConn, abort: bool) -> None:
        """The app closed (FIN) or reset its side of `c`: our side of the stream ends
        there. Not when the app itself is going: killed by a reset, the agent stopping,
        or dying by itself (the OOM killer's SIGKILL, a crash: the kernel closed its
        sockets, the app closed nothing; its exit, reaped soon, stops this replica,
        and the streams go on at the backup that takes over. Framed here, those ends
        reached every client: the backups follow the primary's entries)."""
        if app is not self.app or app.closed or self.stop_event.is_set():
            return
        if self.framer.primary and app.dying():     # (a backup frames the primary's ends)
            self._count("ends_at_app_death")
            return
        if not abort and c.index >= 0 and app.app_reset(c.index):
            abort = True                    # it closed after SO_LINGER 0 (native/shim_group.c)
        self._count("app_resets" if abort else "app_closed")
        if c.end is True and abort:
            abort = False                   # our own reset of its socket, not the app's
        c.app_end = abort
        self._made(*self.framer.app_ended(c.index, Kind.RST if abort else Kind.FIN))
        self._release_if_done(c)

    # -- output commit of the app's external sends (native/llft_shm.h, ctl.commit_*) --
    def _commit_wanted(self) -> None:
        """An external send of the primary's app waits for output commit (loop thread)."""
        if self._commit_task is None or self._commit_task.done():
            self._commit_task = self.tasks.spawn(self._commit_external(self.app), "commit")

    async def _commit_external(self, app: Application) -> None:
        """Answer the tickets taken so far, each once the backups hold every entry the app
        recorded before it: the drain takes those entries (they were appended before the
        ticket), messaging sends them at once, and the answer waits for the backups'
        acknowledgements. No backup: at once. A reset or demotion ends the wait (the app
        is killed)."""
        while app is self.app and self.mode is AppMode.PRIMARY and not app.closed:
            ticket = app.shm.commit_req
            if ticket == self._commit_answered:
                return
            asked = time.monotonic()
            app.owe_drain()             # every record reserved before the ticket
            self._commit_order_info()
            while ((self._oi_pending or not app.owed_drained()
                    or not self.node.order_info_held())
                   and app is self.app and self.mode is AppMode.PRIMARY):
                await self._wait_progress()
                self._commit_order_info()
            if app is not self.app or app.closed:
                return
            app.shm.commit_done(ticket)
            self._commit_answered = ticket
            self._count("external_commits")
            self._count("external_commit_wait_us", int((time.monotonic() - asked) * 1e6))

    def _commit_order_info(self) -> None:
        """The commit waits on every entry recorded so far: drained into messaging, which
        sends them to the backups now."""
        self._take_order_info()
        self.node.want_order_info(self.driver.clock_us())
        self.driver.pump()

    async def _wait_progress(self) -> None:
        self.driver.progress.clear()
        await self.driver.progress.wait()

    # ---- lag (see the module docstring) -----------------------------------------------------
    def _mark(self, pvn: int, pos: int) -> None:
        """Backup: position `pos` of view `pvn` is executed once the app has completed
        every shim entry fed so far."""
        if self.mode is AppMode.BACKUP:
            self._marks.append((pvn, pos, self._fed_total, time.monotonic()))
            self._lag_work.set()

    async def _lag_loop(self) -> None:
        woken = True
        while True:
            if woken:
                await asyncio.sleep(LAG_CHECK_S)    # a reporting period
            woken = True
            if self.mode is AppMode.BACKUP:
                busy = self._report_executed()
            elif self.mode is AppMode.PRIMARY:
                self._check_lag_bound()
                self._check_framing_wait()
                busy = not self.node.lag_quiet() or self.framer.waiting() is not None
            else:
                busy = False
            if not busy:
                # nothing outstanding: wait for entries to move (a backup's marks, the
                # primary's drained entries), and look again now and then regardless
                self._lag_work.clear()
                try:
                    await asyncio.wait_for(self._lag_work.wait(), LAG_IDLE_S)
                except TimeoutError:
                    woken = False       # looking again: no reporting period to wait for

    def _check_framing_wait(self) -> None:
        """A promoted primary whose app has not written bytes its predecessor framed for
        long: its output would differ from what the remote group got (logged once)."""
        waiting = self.framer.waiting()
        if waiting is None:
            self._framing_wait_since = 0.0
            return
        if not self._framing_wait_since:
            self._framing_wait_since = time.monotonic()
        since = self._framing_wait_since
        if since > 0 and time.monotonic() - since > FRAMING_WAIT_LOG_S:
            self._framing_wait_since = -1.0     # logged
            k, n, written = waiting
            c = self.by_index.get(k)
            what = "unknown stream" if c is None else (
                f"{written} so far; connected {c.transport is not None}, app end "
                f"{c.app_end}, remote end {c.end}, outbox {len(c.gc.outbox.buf)} bytes, "
                f"{len(self.framer.pending)} frames to make")
            log.warning(f"the predecessor framed {n} bytes of stream {k} that this "
                        f"application has not written after {FRAMING_WAIT_LOG_S:g} s "
                        f"({what}): its output on every stream waits behind them")

    async def _founding_guard_loop(self) -> None:
        while True:
            await self._joining.wait()          # a member has nothing to guard: no wake-ups
            await asyncio.sleep(FOUNDING_GUARD_S)
            if self.node.status not in mb.MEMBER_STATUSES:
                # read by a helper thread: a busy file system must not stall the loop
                agents = await asyncio.to_thread(self._host_agents)
                self._guard_founding(agents)

    def _host_agents(self) -> list[dict]:
        return status_files.read_files(self.cfg.status_dir(self.group))[0]

    def _guard_founding(self, agents: list[dict] | None = None) -> None:
        """A joiner does not found the group while an agent of this host is a member of it
        and alive (paused or starved: we cannot hear it, yet it holds the group's state;
        founding anew would make two lineages and one of them would lose its state).
        Members on other hosts are not known this way (docs/DESIGN.md). `agents`: the
        status files of this host, read now if not given."""
        if self.node.status in mb.MEMBER_STATUSES:
            return
        why = None
        for st in self._host_agents() if agents is None else agents:
            if (st.get("birth") != self.node.birth and st.get("role") in ("primary", "backup")
                    and st.get("agent_pid") != os.getpid()):
                why = (f"agent pid {st.get('agent_pid')} of this host is a {st.get('role')} "
                       f"of the group (view {st.get('pvn')})")
                break
        if why != self._founding_held:
            _log(f"not founding the group while {why}: asking to join instead" if why else
                 "founding allowed again (no live member on this host)")
            self._founding_held = why
        self.node.hold_founding(why)

    def _report_executed(self) -> bool:
        """Whether anything is outstanding still (entries fed and not executed, a
        catch-up to finish)."""
        consumed = self.app.consumed_entries
        if consumed is None:
            return True
        done = None
        while self._marks and self._marks[0][2] <= consumed:
            done = self._marks.popleft()
        if done is not None:
            self.node.set_executed(done[0], done[1], self.driver.clock_us())
            self.driver.pump()
        now = time.monotonic()
        oldest = self._marks[0][3] if self._marks else now
        self._own_lag = {"entries": self._fed_total - consumed,
                         "ms": round((now - oldest) * 1000, 1)}
        est = self._catch_up_estimate_us(now, consumed)
        self._own_lag["catch_up_ms"] = est // 1000
        self.node.set_catch_up_estimate(est, self.driver.clock_us())
        if (self._sync == "catching-up" and consumed >= self._history_entries
                and (now - oldest) * 1e6 <= self.node.lag_bound_us):
            self._set_sync("ready")
            s = now - self._restored_mono
            _log(f"caught up: the application replayed the history it joined with "
                 f"({self._history_entries} entries) in {s:.2f} s; ready")
            self._event("ready", replay_s=round(s, 3), entries=self._history_entries)
        return bool(self._marks) or consumed < self._fed_total or self._sync == "catching-up"

    def _catch_up_estimate_us(self, now: float, consumed: int) -> int:
        """How long the app needs for the entries it was given and has not executed:
        their count over its execution rate of the last CATCH_UP_WINDOW_S (no progress
        in that window: CATCH_UP_WAIT_MAX_S). No takeover by us before this replay
        would end (Membership.set_catch_up_estimate). An app with no progress that waits
        for input it has not been given (bytes the dead primary read, which messaging
        delivers here only in the next view) cannot catch up by waiting: 0. Without this a
        backup held its takeover for CATCH_UP_WAIT_MAX_S (test_streams' thread bursts)."""
        progress = self._progress
        progress.append((now, consumed))
        while now - progress[0][0] > CATCH_UP_WINDOW_S:
            progress.popleft()
        left = self._fed_total - consumed
        if left <= 0:
            return 0
        if len(progress) > 1 and progress[-2][1] == consumed and self.app.waiting_for_input:
            return 0
        t0, c0 = progress[0]
        rate = (consumed - c0) / max(now - t0, LAG_CHECK_S)      # entries per second
        est = left / rate if rate > 0 else CATCH_UP_WAIT_MAX_S
        return int(min(est, CATCH_UP_WAIT_MAX_S) * 1e6)

    def _check_lag_bound(self) -> None:
        released = self.node.stats.get("lag_released", 0)
        held = self.driver.call(self.node.lag_hold, self.driver.clock_us())
        if self.node.stats.get("lag_released", 0) > released:
            b, why = self.node.last_lag_release
            _log(f"backup {b:x} is no longer held for: {why}; a takeover by it may replay "
                 "more than the bound (held for again once it has stayed within it as "
                 "long)")
            self._event("lag_released", backup=f"{b:x}")
        if held == self._lag_held:
            return
        self._lag_held = held
        self.app.hold(held)
        lags = self.node.backup_lag(self.driver.clock_us())
        # the one held for that is furthest behind (a joiner still replaying may be further
        # behind, but it is not held for: naming it blamed the wrong replica)
        worst = max(((b, lags[b]) for b in self.node.lag_held_for if b in lags),
                    key=lambda kv: kv[1]["ms"], default=None)
        if held:
            self._held_since = time.monotonic()
            self._count("lag_holds")
            who = f"{worst[0]:x} is {worst[1]['ms']:.0f} ms ({worst[1]['entries']} " \
                  f"positions) behind" if worst else "a backup is behind"
            _log(f"backpressure: backup {who}, beyond the bound of "
                 f"{self.node.lag_bound_us / 1000:.0f} ms: the application is held at "
                 "its next ordered call")
        else:
            ms = (time.monotonic() - self._held_since) * 1000
            _log(f"backpressure released after {ms:.0f} ms: backups within the bound")
        self._write_status()

    # ---- status --------------------------------------------------------------------------
    async def _status_loop(self) -> None:
        next_orphan_check = next_hang_rearm = 0.0
        last_moved = -1
        while True:
            if time.monotonic() >= next_hang_rearm:
                # a loop that stops (a blocking call, a deadlock) leaves the log silent: if
                # this task does not re-arm it in time, every thread's stack goes to the
                # log (each arming starts a thread: not at every status period)
                next_hang_rearm = time.monotonic() + LOOP_HANG_S / 4
                faulthandler.dump_traceback_later(LOOP_HANG_S, repeat=True)
            self._write_status()
            if self.app.diverged:
                self._diverged()
            strays, said = self.app.stray_connections, self.counters.get("stray_connections", 0)
            if strays > said:
                _log(f"{strays - said} connection(s) to "
                     "the application's group listener from another process than this agent "
                     "were closed (native/shim_group.c): clients reach the group through "
                     "`llft gateway`")
                self.counters["stray_connections"] = strays
            if self.node.log_full and not self.counters.get("log_full_logged"):
                self.counters["log_full_logged"] = 1
                log.warning(f"{self.node.log_full}: it was dropped; this group admits no new "
                            "replica from now on (docs/LOG.md)")
            if time.monotonic() >= next_orphan_check:
                # orphans reparented to us (subreaper) are reaped; descendants that left
                # their app's session are named to the watchdog
                next_orphan_check = time.monotonic() + proctree.ORPHAN_CHECK_S
                proctree.reap_orphans()
                self.watchdog.report_escapees(self._sessions)
                self._watch_children()
                self.counters["escapees_watched"] = len(self.watchdog.reported)
                self.counters.update(proctree.SCAN_STATS)   # their count and cost
            # a quiet agent's cost is its wake-ups, and writing its status is one of the
            # dearest: while nothing but heartbeats moved, once a second (events such
            # as a view change write it at once: `_event`)
            c = self.endpoint.counters
            moved = c["accepted_messages"] + c["sent_datagrams"]
            period = STATUS_PERIOD_S if moved != last_moved else STATUS_IDLE_PERIOD_S
            last_moved = moved
            t, times = time.monotonic(), stalls.thread_times()
            await asyncio.sleep(period)             # a reporting period
            # how late the loop woke: a busy or starved agent misses heartbeats
            elapsed = time.monotonic() - t
            lag_ms = int((elapsed - period) * 1000)
            if lag_ms > self.counters.get("loop_lag_max_ms", 0):
                self.counters["loop_lag_max_ms"] = lag_ms
            if lag_ms >= self.cfg.fault_timeout_ms:
                # as long as a peer's detector waits: says which side a takeover's
                # "silent for" was (this agent stalled, or its peer's judgement)
                self.counters["loop_lags_logged"] = self.counters.get("loop_lags_logged", 0) + 1
                why = stalls.stood_still(elapsed, times, stalls.thread_times())
                log.info(f"event loop woke {lag_ms} ms late (a detector's floor is "
                         f"{self.cfg.fault_timeout_ms:g} ms)" + (f": {why}" if why else ""))

    def status(self) -> dict:
        replica = self.node.status_snapshot()
        transport = self._transport_stats()
        self._heard_mark = (time.monotonic(), transport)
        order_info = replica.pop("order_info")
        node_stats = replica.pop("stats")
        app = self.app
        return {
            "group": self.group, **replica, "host": socket.gethostname(),
            "agent_pid": os.getpid(), "agent_start": status_files.own_start(),
            "app_pid": app.pid,
            "app_mode": app.mode.value,
            "order_info": {
                **order_info,
                "fed_entries": app.fed_entries,
                "consumed_entries": app.consumed_entries,
                "drain_wakeups": app.drain_wakeups,
            },
            "sync": self._sync, "own_lag": self._own_lag if self._sync != "none" else None,
            "lag_held": self._lag_held,
            "handing_off": None if self._handing_off is None else f"{self._handing_off:x}",
            "connections": self.registered,
            "connections_open": len(self.conns),
            # streams (client connections) in the group connections, and those
            "streams": {"open": sum(len(g.streams.open) for g in self.group_conns.values()),
                        "freed": self.streams_freed,
                        "group_connections": len(self.group_conns),
                        "outbox_bytes": sum(len(g.outbox.buf)
                                            for g in self.group_conns.values())},
            "rss_kb": _rss_kb(),
            "diverged": app.divergence,
            "local_failure": self.local_failure,
            "lane": self._lane_status(),
            "counters": {**self.counters, **{f"node_{k}": v for k, v in node_stats.items()},
                         **{f"framer_{k}": v for k, v in self.framer.stats.items()}},
            "transport": transport,
            "events": self.events[-20:],
            "written_mono": time.monotonic(),
        }

    def _lane_status(self) -> dict:
        """The backup lane's events, loans and what took each loan back, since the
        messaging core was last made (a reset makes a new one); none: LLFT_LANE=off."""
        m = self.node.messaging
        return {"kind": self.lane_kind,
                "events": getattr(m, "backup_events", 0),
                "loans": getattr(m, "backup_loans", 0),
                "reclaimed_for": dict(getattr(m, "reclaims", {}))}

    def _write_status(self) -> None:
        path = os.path.join(self.cfg.status_dir(self.group), f"{self.node.birth:x}.json")
        self.status_file.write(path, self.status())     # written by a helper thread
        sf = self.status_file
        if sf.errors and not self.counters.get("status_write_errors"):
            _log(f"cannot write status under {self.cfg.runtime_dir}: {sf.last_error}")
        self.counters["status_write_errors"] = sf.errors


# ---- command line ------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="cluster configuration (TOML)")
    p.add_argument("--group", required=True, help="the group this replica belongs to")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...",
                   help="the application to replicate")


def run(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("llft run: no command: llft run --config F --group G -- CMD...", file=sys.stderr)
        return 2
    if shutil.which(cmd[0]) is None:    # before joining: a backup would fail only later
        print(f"llft run: {cmd[0]}: command not found (not on PATH, or not an executable "
              "file)", file=sys.stderr)
        return 2
    own_session()                       # its CPU boost is for it alone (application.py)
    why_not = raise_agent_priority()    # before any thread starts (nice is per thread)
    batch_scheduling()                  # ... as is the policy
    raise_fd_limit()
    try:
        cfg = config_mod.load(args.config)
        config_mod.check_interface(cfg)
        agent = Agent(cfg, args.group, cmd)
    except (config_mod.ConfigError, keys.KeyFileError) as e:
        print(f"llft run: {e}", file=sys.stderr)
        return 2
    logs.setup(args.group)              # the birth id joins the name once drawn (run)
    if why_not:
        log.warning(why_not)
    try:
        return pulse.run(agent.run())     # its loop gives the pulse thread a lease
    except OSError as e:
        log.error(f"{e}")
        return 2
