"""The shared-memory block between an agent and the preload shim of its app.

This is the API the replica runtime calls to pump order information:

    shm = Shm.create(Shm.PRIMARY)        # or Shm.BACKUP
    env = shm.env()                      # LLFT_SHM=...; the runner adds LD_PRELOAD, pid
    # primary: shim -> network
    data = shm.drain(timeout_ms=50)      # whole entries, global order (bytes; codec = orderinfo)
    shm.wait(timeout_ms)                 # 1 once there is something to drain (takes nothing),
                                         # 2 once an external send waits for output commit
    w = shm.drain_watcher(coalesce_us, wait_ms)  # a native thread: w.fd is readable when
                                         # entries wait undrained or an external send waits
                                         # for output commit (w.take(), w.drained())
    shm.set_commit(True)                 # primary: external sends wait for commit_done(t)
    shm.commit_req, shm.commit_done(t)   # (t: a ticket; the backups hold all before it)
    # backup: network -> shim
    feeder = shm.feeder()
    feeder.push(data)                    # entries in the primary's order; blocks only
                                         # while a thread's ring is full (bounded)
    feeder.done()                        # no more will come (trace end): a thread that
                                         # wants more is reported as diverged
    shm.promote()                        # backup -> primary (the shim keeps its CTS offset)
    shm.hold(True|False)                 # primary: ordered calls wait while held
                                         # (backpressure from a lagging backup)
    shm.diverged, shm.report, shm.stats()
    # group connections (env LLFT_SERVICE_PORT=<service port>, see native/shim_group.c)
    shm.group_id                         # the app's group listener, 0 until its listen()
    shm.group_address                    # its abstract AF_UNIX address (bytes) or None
    shm.reset_conn(k) / shm.app_reset(k) # a group connection's reset, each way
    shm.divergence                       # (connection index, stream offset) of a group write
                                         # divergence, or None

All ring work is in C (native/shm_build.py, the same inline code as the shim); cffi
drops the GIL during those calls. The modes, the ctl words read here and the stats
are the header's enums (`Mode`, `CtlWord`, `Stat`), never bare numbers.
"""
from __future__ import annotations

import collections
import mmap
import os
import secrets
import time

from determinizer.orderinfo import split
from native import _llft_shm, c_enum  # built by setup.py from native/shm_build.py

ffi, lib = _llft_shm.ffi, _llft_shm.lib
DRAIN_CHUNK_BYTES = 1 << 20
# The agent's reset marks still out (ctl.resets) before it lets the oldest go: half the
# table, so the app's own marks (a close after SO_LINGER 0) always find room.
AGENT_RESET_MARKS = lib.LLFT_RESET_SLOTS // 2
NOTES_NONE = 0xFFFFFFFF     # `_notes(which, NOTES_NONE)`: a ring's count, no note copied

Mode = c_enum("Mode", "enum llft_mode", "LLFT_MODE_")
CtlWord = c_enum("CtlWord", "enum llft_ctl_word", "LLFT_CTL_")
Stat = c_enum("Stat", "enum llft_stat", "LLFT_ST_")


class Shm:
    OFF, PRIMARY, BACKUP = Mode.OFF, Mode.PRIMARY, Mode.BACKUP
    NOTE_SLOTS = lib.LLFT_NOTE_SLOTS    # each note ring keeps the latest this many

    def __init__(self, path: str, mm: mmap.mmap, owner: bool):
        self.path = path
        self._mm = mm
        self._base = ffi.from_buffer(mm)
        self._owner = owner
        self._drain_buf = ffi.new("uint8_t[]", DRAIN_CHUNK_BYTES)
        self._agent_marks: collections.deque[int] = collections.deque()  # oldest first

    @staticmethod
    def paths_of(pid: int, directory: str = "/dev/shm") -> list[str]:
        """The files `create` made in process `pid` that are still there (named after
        it: a SIGKILLed creator cannot unlink them)."""
        prefix = f"llft-{pid}-"
        return sorted(os.path.join(directory, f) for f in os.listdir(directory)
                      if f.startswith(prefix))

    @classmethod
    def create(cls, mode: int, stall_ms: int = 10000, directory: str = "/dev/shm") -> "Shm":
        path = os.path.join(directory, f"llft-{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, lib.llft_shm_size())   # sparse: pages appear when touched
            mm = mmap.mmap(fd, lib.llft_shm_size(), mmap.MAP_SHARED)
        finally:
            os.close(fd)
        shm = cls(path, mm, owner=True)
        lib.llft_shm_init(shm._base, mode, stall_ms)
        return shm

    def env(self, service_port: int | None = None) -> dict[str, str]:
        env = {"LLFT_SHM": self.path}
        if service_port:
            env["LLFT_SERVICE_PORT"] = str(int(service_port))
        return env

    # ---- primary: shim -> agent
    def drain(self, timeout_ms: int = 50) -> bytes:
        n = lib.llft_drain(self._base, self._drain_buf, DRAIN_CHUNK_BYTES, timeout_ms)
        return bytes(ffi.buffer(self._drain_buf, n)) if n else b""

    @property
    def out_reserved(self) -> int:
        """Bytes of the primary ring reserved by the app's threads so far (monotonic): a
        record is reserved, written, then committed, and a drain stops at the first one
        not committed yet."""
        return lib.llft_out_reserved(self._base)

    @property
    def out_drained(self) -> int:
        """Bytes of the primary ring drained so far (monotonic)."""
        return lib.llft_out_drained(self._base)

    def wait(self, timeout_ms: int = 50, seen_commit_req: int | None = None) -> int:
        """1 as soon as the primary ring holds order information to drain (taken by
        nobody: a drain() follows), 2 as soon as an output commit beyond
        `seen_commit_req` is asked for (`commit_req`), 0 after timeout_ms. Takes nothing,
        so it needs no lock beside a drainer (the drain watcher waits the same way, in C)."""
        seen = self.commit_req if seen_commit_req is None else seen_commit_req
        return lib.llft_wait(self._base, int(timeout_ms), seen & 0xFFFFFFFF)

    # ---- primary: output commit of external sends (native/llft_shm.h, ctl.commit_*)
    def set_commit(self, on: bool) -> None:
        """While on, the app's external sends wait for `commit_done` (an agent's app)."""
        lib.llft_set_commit(self._base, 1 if on else 0)

    @property
    def commit_req(self) -> int:
        """The last ticket an external send took (it waits until commit_done reaches it)."""
        return self._get(CtlWord.COMMIT_REQ)

    def commit_done(self, ticket: int) -> None:
        """Every entry appended before `ticket` was taken is held by every backup."""
        lib.llft_commit_done(self._base, ticket & 0xFFFFFFFF)

    def drain_watcher(self, coalesce_us: int, wait_ms: int) -> "DrainWatcher":
        return DrainWatcher(self, coalesce_us, wait_ms)

    # ---- backup: agent -> shim
    def feeder(self) -> "Feeder":
        return Feeder(self)

    def promote(self) -> None:
        lib.llft_set_mode(self._base, self.PRIMARY)

    def hold(self, on: bool) -> None:
        """Primary: while on, the app's threads wait at their next ordered call."""
        lib.llft_set_hold(self._base, 1 if on else 0)

    @property
    def held(self) -> bool:
        return bool(self._get(CtlWord.HOLD))

    # ---- state
    def _get(self, word: CtlWord) -> int:
        return lib.llft_get(self._base, word)

    @property
    def mode(self) -> Mode:
        return Mode(self._get(CtlWord.MODE))

    @property
    def active_pid(self) -> int:
        return self._get(CtlWord.ACTIVE_PID)

    @property
    def diverged(self) -> bool:
        return bool(self._get(CtlWord.DIVERGED))

    @property
    def group_id(self) -> int:
        """The app's group listener (0 until the app has called listen() on a socket bound
        to LLFT_SERVICE_PORT, and again once it closed it)."""
        return self._get(CtlWord.GROUP_ID)

    @property
    def group_address(self) -> bytes | None:
        """Where the agent connects the group connections (an abstract AF_UNIX address),
        or None before listen()."""
        buf = ffi.new("char[64]")
        n = lib.llft_group_name(self._base, buf, 64)
        return b"\0" + ffi.buffer(buf, n)[:] if n else None

    def reset_conn(self, conn: int) -> bool:
        """The agent is about to close group connection `conn` (its acceptance index) as
        a reset: the app's read of its end fails with ECONNRESET, as after a TCP RST,
        however late it reads. The mark is the app's to take (when it reads the end, or
        closes the connection): the agent's side of the stream ends at the close, and
        forgetting the mark there made an app that read after the agent's next loop
        turn read a plain end. An app that closed before the reset came leaves its mark
        untaken: the agent lets its oldest mark go once more than AGENT_RESET_MARKS are
        out. False: no room to say so (the app reads a plain end)."""
        self._agent_marks.append(conn)
        if len(self._agent_marks) > AGENT_RESET_MARKS:
            lib.llft_conn_reset_take(self._base, lib.LLFT_RESET_BY_AGENT,
                                     self._agent_marks.popleft())
        return bool(lib.llft_conn_reset_mark(self._base, lib.LLFT_RESET_BY_AGENT, conn))

    def app_reset(self, conn: int) -> bool:
        """Whether the app reset group connection `conn` (it closed it with SO_LINGER 0)
        rather than closed it; the answer is taken (asked once, at the end it read)."""
        return bool(lib.llft_conn_reset_take(self._base, lib.LLFT_RESET_BY_APP, conn))

    def forget_app_reset(self, conn: int) -> None:
        """`conn` is gone at the agent: a reset the app marked that the agent never read
        (it read the end as a reset already) frees its slot. The agent's own marks stay
        for the app (`reset_conn`)."""
        lib.llft_conn_reset_take(self._base, lib.LLFT_RESET_BY_APP, conn)

    @property
    def divergence(self) -> tuple[int, int] | None:
        """(connection index, stream offset) of a group write that differed from the
        primary's: the connection's 0-based order of acceptance on the group listener
        and the offset of the differing write's first byte. None otherwise (also for
        divergences of other kinds: see `diverged` and `report`)."""
        if not self._get(CtlWord.DIV_SET):
            return None
        return (self._get(CtlWord.DIV_CONN), lib.llft_div_offset(self._base))

    def signals_sent(self) -> list[tuple[int, int]]:
        """The latest signals the app sent other processes (kill/killpg, noted before
        they were sent): (target, signal) pairs, the target as kill() takes it (< 0: a
        process group, 0: the app's own). At most LLFT_NOTE_SLOTS, oldest first."""
        return self._notes(0)[1]

    @property
    def signals_sent_count(self) -> int:
        """How many signals the app ever sent (`signals_sent` keeps the latest
        NOTE_SLOTS)."""
        return self._notes(0, NOTES_NONE)[0]

    def children_reaped(self) -> dict[int, int]:
        """The latest children the app reaped (waitpid): pid -> real wait status."""
        return dict(self._notes(1)[1])

    def reaped_since(self, seen: int) -> tuple[int, list[tuple[int, int]]]:
        """The children reaped after the first `seen` reaps, (pid, wait status) oldest
        first (the latest LLFT_NOTE_SLOTS at most), and the count of reaps so far."""
        return self._notes(1, seen)

    def signals_received(self) -> list[tuple[int, int]]:
        """The latest SIGTERM, SIGINT and SIGHUP that a process sent a program the app
        started and that its handler received (native/notes/): (receiver, signal)."""
        return self._notes(2)[1]

    def received_since(self, seen: int) -> tuple[int, list[tuple[int, int]]]:
        """`signals_received` after the first `seen`, and the count so far."""
        return self._notes(2, seen)

    @property
    def child_news(self) -> int:
        """A number that moves when the app may have learnt of a child's death: it met
        the end of a private connection or a pipe, or reaped a child; or when a program
        it started received a signal that may end it (`signals_received`)."""
        return self._get(CtlWord.CHILD_NEWS)

    def _notes(self, which: int, since: int = 0) -> tuple[int, list[tuple[int, int]]]:
        """(how many notes ring `which` ever took, those numbered `since` and after that
        it still keeps): only those are copied (NOTES_NONE: the count alone)."""
        if self._base is None:
            return 0, []
        out = ffi.new("int32_t[]", 2 * lib.LLFT_NOTE_SLOTS)
        count = ffi.new("uint32_t *")
        n = lib.llft_proc_notes(self._base, which, min(since, NOTES_NONE), out, count)
        return count[0], [(out[2 * i], out[2 * i + 1]) for i in range(n)]

    @property
    def report(self) -> str:
        return ffi.string(lib.llft_report(self._base)).decode(errors="replace").strip()

    def stats(self) -> dict[str, int]:
        """{"records": ..., "waits": ..., "gil_drops": ..., "ring_full": ..., "held": ...,
        "input_wait": ..., "commits": ..., "stray_conns": ...}"""
        return {st.name.lower(): lib.llft_stat(self._base, st) for st in Stat}

    def close(self) -> None:
        self._base = None
        self._drain_buf = None
        try:
            self._mm.close()
        except BufferError:
            pass
        if self._owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


class DrainWatcher:
    """A primary's native drain watcher (native/shm_build.py, llft_dw_*): a C thread that
    signals `fd` (an eventfd: register it with the loop) when the ring holds entries
    nobody drained for `coalesce_us`, or an external send asks for output commit.
    `take()` -> (order_info, commit) after the fd was readable; `drained()` after every
    drain; `stop()` asks the thread to end, `join()` (off the loop: it may take wait_ms)
    waits for it and closes the fd. The block must stay mapped until `join()`."""

    def __init__(self, shm: Shm, coalesce_us: int, wait_ms: int):
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._w = lib.llft_dw_start(shm._base, self.fd, int(coalesce_us), int(wait_ms))
        if self._w == ffi.NULL:
            os.close(self.fd)
            raise OSError("the drain watcher thread could not be started")

    def drained(self) -> None:
        lib.llft_dw_drained(self._w)

    def take(self) -> tuple[bool, bool]:
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass
        flags = lib.llft_dw_take(self._w)
        return bool(flags & 1), bool(flags & 2)

    def stop(self) -> None:
        lib.llft_dw_stop(self._w)

    def join(self) -> None:
        if self._w is not None:
            lib.llft_dw_join(self._w)
            self._w = None
            os.close(self.fd)


class Feeder:
    """Pushes order information, in the primary's order, into the backup shim's rings.

    The same object is fed from a trace file (`llft replay`) or from the network
    (the replica runtime). It keeps, per operation, how many entries it has fed: that
    count is the `oseq` an entry waits for (the paper's o.orderinfo queue)."""

    def __init__(self, shm: Shm):
        self._shm = shm
        self._tab = ffi.gc(lib.llft_seqtab_new(), lib.llft_seqtab_free)
        self._pending = b""
        self.fed_bytes = 0
        self.stopped = False   # set by the owner when the process is gone

    @property
    def fed_entries(self) -> int:
        """Entries fed so far (llft_feed counts them as it numbers their oseq)."""
        return lib.llft_seqtab_fed(self._tab)

    def push(self, data: bytes, timeout_s: float | None = None, wait: bool = True) -> bool:
        """Feed whole entries (a partial trailing entry is kept for the next call).
        `wait` False: only what fits in the rings now; the rest is kept too, for a
        later push (of b"" or more). True when no whole entry is left unfed."""
        buf = self._pending + data
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        off = 0
        while off < len(buf) and not self.stopped:
            chunk = buf[off:]
            n = lib.llft_feed(self._shm._base, chunk, len(chunk), self._tab,
                              100 if wait else 0)
            if n < 0:
                raise ValueError(f"malformed order information at offset {self.fed_bytes + off} ({n})")
            off += n
            if n == 0:
                # a thread's ring is full (it is behind), or only a partial entry is left
                if split(chunk, max_entries=1)[0] == 0:      # no whole entry left
                    break
                if not wait:
                    self.fed_bytes += off
                    self._pending = bytes(buf[off:])
                    return False
                if self._shm.diverged:
                    raise RuntimeError("the determinized process diverged: " + self._shm.report)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError("feeder: the determinized process does not consume")
        self.fed_bytes += off
        self._pending = bytes(buf[off:])
        return True

    @property
    def consumed(self) -> int:
        """Entries the shim has completed (a backup's progress)."""
        return self._shm._get(CtlWord.PROGRESS)

    def done(self) -> None:
        lib.llft_feed_done(self._shm._base)
