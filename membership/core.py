"""The LLFT leader-determined membership protocol and fault detector, sans-IO, one per replica.

Theory of operation
-------------------
A replica is in one `Status` at a time:

    JOINING ──AcceptBackup(me)──▶ AWAITING_STATE ──State chunks──▶ BACKUP
       │  (silence: found)                                           │ fault detector
       ▼                                                             ▼ fires
    PRIMARY_PHASE2 ◀──all acknowledged── PROPOSING ◀─────────────────┘
       │ phase2_complete()
       ▼
    PRIMARY          any status ──reset──▶ JOINING (new birth id)

and holds one membership: (pvn, change, members), members ordered by precedence, the
primary first (it always has the lowest precedence: a new primary excludes every lower
one, a new backup gets a precedence above all ever assigned). Ranks are positions in
that list, recomputed on every change. `change` numbers the membership changes inside a
primary view; (pvn, primary, change) names one membership.

Paper pseudocode, change of primary (figure alg-primary-change):
  lines 1-5    `_fault_detector_fired` -> `_propose`: the rank-r backup's detector times
               out the primary (timeouts grow with rank, `rules.fault_timeout_us`); it
               proposes view v+1 excluding the old primary and lower precedences.
  lines 14-16  `_on_pp_ack` -> `_complete_phase1`: all proposed members acknowledged.
  lines 21-25  `_on_propose_primary`: ACCEPT / RESET / IGNORE (`rules.decide_propose_primary`),
               for proposals that replace our own view (the body names it: old_pvn,
               old_primary); a proposal from another branch is ignored.
  lines 28-35  phase 2 belongs to messaging: we emit `BeginPhase2`; the runtime runs
               NewPrimaryView on every inter-group connection and calls
               `phase2_complete(pvn)` at the virtual synchrony point; we emit
               `ViewStarted`, on which the runtime resets message sequence numbers, calls
               messaging `set_view`, and emits the order-info entry that switches the
               backups to the new view at the same point.
Change of a backup (figure alg-backup-change):
  lines 1-14   `_joiner_tick`: ProposeBackup with a birth id, retransmitted; a joiner that
               hears no group at all founds one (the "first member" case).
  line 23      `_admit`: the primary assigns the next precedence (above `max_precedence`,
               which travels in every membership message so a new primary continues it).
  lines 15-18, 43-46  `_on_membership`: accept and acknowledge, or reset when excluded.
  lines 28-34  `_remove`: RemoveBackup for silent backups and for backups that do not
               acknowledge a change promptly (`ack_timeout_us`).
  lines 39-42  `_commit` -> `_start_transfer`: at commit the primary checkpoints
               (`StateProvider.checkpoint`) and sends State chunks, acknowledged and
               retransmitted; lines 20-21: the joiner `restore`s.
Partitions (messaging lines 18-20, theorem 1 case 2): a message only a primary sends
(rank-1 Heartbeat, AcceptBackup, RemoveBackup, State) from a primary that is not ours and
outranks ours makes us re-multicast it and reset; so after a heal every branch but the
highest is pruned. Beyond the paper, so that the branch kept is the one the clients saw
(docs/ARCHITECTURE.md open item 9): branches rank by (older lineage, served, precedence)
(`rules.competing_primary_wins`; heartbeats carry lineage, served and the membership
change), and a backup with remote connections takes over only once a remote group
answers its PROBE that our primary is silent there too (`_awaiting_evidence`,
`probe_answered`): a backup cut off alone holds instead of founding a branch. An
answer from a remote member cut off as long as we are (it hears no majority of its own
group: `probe_state`) is evidence only where a majority decides for us, where no group
has one to find, or after a long hold (`_lost_answer_counts`): the cut of one host
running a replica of each group otherwise let both cut-off backups take over.

Beyond the paper (it is silent on these; see docs/ARCHITECTURE.md "Membership"):
  * a proposed member that neither acknowledges nor speaks for `ack_timeout_us` is
    dropped from the proposal (new `change` of the same proposal): otherwise a member
    crashing during phase 1 blocks the group forever;
  * a backup still awaiting its State cannot serve as primary: it resets instead of
    proposing or accepting a proposal;
  * the primary answers a heartbeat from a replica that believes it is a member but is
    not with its current membership, so a wrongly removed backup learns it and rejoins;
  * a HEARTBEAT another core of this replica sent with our header stands for ours
    (`heartbeat_carried`; llft/replica/node.py): ours waits while that one comes, and
    while the driver repeats it (a `Pulse`) our tick waits for its refresh;
  * copies of a message the driver absorbed (byte-identical, `heard_again`) are each
    noted as heard when they came; the last is handled as any message.

A busy machine is not a dead peer (docs/DESIGN.md, last section):
  * every timeout that removes or replaces a member (the fault detector, the removal of
    a silent backup, the ack timeouts of a change and of a proposal) is the configured
    value extended per peer by what that peer's message timing has shown, by at most
    `Config.extension_cap_us` (membership/detector.py). Every rank extends its
    detector by the same amount, so the ranks keep their order;
  * a local stall (no tick for STALL_SLACK_INTERVALS heartbeat intervals beyond the
    tick period: an interval, or a Pulse's refresh period) counts
    against no one, whichever event sees it first: the timer, or a message whose
    handler judges the others (`_observe_clock`, `_forgive_stall`);
  * a replica reset again before it was a stable member backs off before it applies
    (`_reset`): exponentially, with jitter from its rng, bounded.

Everything is bounded: `MAX_MEMBERS`, `MAX_PENDING_JOINERS`, `MAX_TRACKED_JOINERS`,
`MAX_TRACKED_VIEWS`, `MAX_STATE_CHUNKS`, `MAX_ACTIONS`.
"""
from __future__ import annotations

import enum
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

from llft.protocol.messages import (Message, MsgType, Pulse, Role, Send, probe, pulse_lease_us,
                                    pulse_until_us)
from membership.detector import ArrivalStats, extension_us, window_for
from membership.rules import (Key, PPDecision, competing_primary_wins, decide_propose_primary,
                              describe_lineage, lineage_of,
                              fault_timeout_us, may_propose, proposal_members)

MAX_MEMBERS = 16             # members of one group, the primary included
MAX_PENDING_JOINERS = 8      # ProposeBackups queued at the primary
MAX_TRACKED_JOINERS = 32     # other joiners a joiner remembers (founding tie-break)
MAX_STATE_CHUNKS = 65_536    # chunks of one checkpoint (x chunk size = largest state)
MAX_TRACKED_VIEWS = 8        # view numbers whose proposals a member remembers
MAX_ACTIONS = 4_096          # actions not yet taken by the driver
MAX_PROBED_GROUPS = 64       # remote groups a held backup probes per interval
LONG_QUIET_US = 3_600_000_000  # "not heard a majority of our group since ever" in a PROBE answer
STALL_SLACK_INTERVALS = 2    # no event for this many heartbeat intervals: a local stall
SETTLING_HEARTBEATS = 20     # a member just given our state: heartbeats before normal timeouts
MAX_BACKOFF_LEVEL = 30       # doublings of the rejoin back-off remembered (then capped anyway)
REMOVAL_WAIT_STEP_MS = 10    # a primary's HEARTBEAT `rm`, rounded down to this (`removal_wait_ms`)


class Status(enum.Enum):
    JOINING = "joining"
    AWAITING_STATE = "awaiting_state"
    BACKUP = "backup"
    PROPOSING = "proposing"
    PRIMARY_PHASE2 = "primary_phase2"
    PRIMARY = "primary"

    # members are singletons: identity hashing, in C (Enum's own hashes the name in
    # Python, and statuses and timers are looked up after every event)
    __hash__ = object.__hash__


MEMBER_STATUSES = frozenset(Status) - {Status.JOINING}
PRIMARY_STATUSES = frozenset({Status.PRIMARY_PHASE2, Status.PRIMARY})
# messages that only a primary sends: they reveal a (possibly competing) primary
PRIMARY_ONLY = frozenset({MsgType.ACCEPT_BACKUP, MsgType.REMOVE_BACKUP, MsgType.STATE})


class RemoteProtocolError(ValueError):
    """A peer sent a membership message that violates the protocol (counted, dropped)."""


class StateProvider(Protocol):
    """The application state a joining backup needs (filled by the determinizer: the
    group's log of inputs and order info). `checkpoint` runs at the primary at the
    virtual synchrony point of an addition; `restore` at the joining backup. A provider
    may also define `join_refusal() -> str | None`: a reason (its log reached its cap,
    docs/LOG.md) and the primary admits no new backup: it answers each application with
    REFUSE_BACKUP, and the applicant's core emits `JoinRefused`."""

    def checkpoint(self) -> bytes | None: ...   # None: no whole state (joiner removed)

    def restore(self, data: bytes) -> None: ...


class EmptyState:
    def checkpoint(self) -> bytes:
        return b""

    def restore(self, data: bytes) -> None:
        pass


@dataclass(frozen=True)
class Config:
    """Timing for a LAN. The paper detects a failed primary in about 30 ms. We send a
    heartbeat every 5 ms and let the rank-2 backup wait 25 ms (five intervals): it then
    suspects only after four consecutive heartbeats are lost (about 1e-8 at 1 % loss)
    and asyncio timer jitter and GC pauses of a few ms stay far inside the margin;
    detection lands 20-25 ms after the crash. Rank r waits
    base + (r - 2) * (inaction + skew), 25 / 75 / 125 ms by default. The primary removes a
    backup only after 50 ms of silence: a removal is not urgent (the primary keeps
    serving) and a false one costs a rejoin with a full state transfer.

    These are floors: each timeout on a peer is extended by what that peer's message
    timing has shown (membership/detector.py), by at most `adaptive_cap_us` (default
    3 x timeout_base_us). A replica reset again before it was a member for
    `rejoin_stable_us` waits `rejoin_backoff_min_us`, doubled at each further reset up
    to `rejoin_backoff_max_us` (with jitter: half to all of it), before it applies. The defaults suit the simulator's LAN; `llft run` derives
    its own from `fault_timeout_ms` (llft/runtime/agent.py)."""
    group: str
    heartbeat_interval_us: int = 5_000
    timeout_base_us: int = 25_000
    inaction_us: int | None = None        # default: timeout_base_us
    skew_us: int | None = None            # default: timeout_base_us
    backup_timeout_us: int = 50_000       # primary: silence before RemoveBackup
    retransmit_us: int = 5_000            # ProposePrimary / AcceptBackup / RemoveBackup / State
    ack_timeout_us: int = 50_000          # unacknowledged change -> remove the member
    join_retry_us: int = 10_000           # ProposeBackup period
    found_timeout_us: int = 100_000       # joiner hears no member this long -> founds the group
    # ... a replica reset from the group waits this long instead (default 10 x the above):
    # it knows the group lived a moment ago, so hearing nobody is likelier a cut than the
    # group's end (`_found_deadline_us`)
    refound_timeout_us: int | None = None
    state_chunk_bytes: int = 16_384
    state_window_chunks: int = 8          # State chunks in flight, unacknowledged
    # A joiner restores the state it was given in one piece (unpacks it, rebuilds the
    # log, starts its app): ~0.5 s for 40 MB on a quiet 2-core box, its agent silent
    # meanwhile. Beyond the first MiB the primary waits this much longer per MiB before
    # it calls a member it just gave its state silent (a joiner of a long-lived group
    # was otherwise removed at every attempt, for minutes).
    restore_allowance_us_per_mib: int = 50_000
    adaptive_cap_us: int | None = None    # longest extension of a timeout; default 3 x base
    # a live primary speaks to each remote group at least every keep-alive interval
    # (messaging's 15 ms): a remote group that heard ours less long ago than this, and
    # after it fell silent to us, says it lives (`probe_answered`)
    live_remote_silence_us: int = 45_000
    # a PROBE answer from a remote member that hears no majority of its own group (it is
    # cut off as we may be: `probe_state`) counts as evidence at once only where no
    # majority decides (`_lost_answer_counts`); otherwise once our takeover has been held
    # this long (default 40 x timeout_base_us: 1 s): three crashes must not stall the
    # survivors for ever, and a cut longer than this is served on both sides, as before
    lost_evidence_after_us: int | None = None
    rejoin_backoff_min_us: int = 10_000   # a second reset waits this long before it applies
    rejoin_backoff_max_us: int = 80_000   # the wait doubles up to this
    rejoin_stable_us: int = 1_000_000     # member this long before a reset: back to the min
    catch_up_wait_max_us: int = 60_000_000   # longest a backup's own replay delays a takeover
    # a primary alone says its heartbeat as a Pulse refreshed every this many intervals
    # while it says the same (messages.Pulse; messaging's MessagingConfig.pulse_intervals)
    pulse_intervals: int = 50
    host: str = ""
    pid: int = 0

    @property
    def refound_us(self) -> int:
        return 10 * self.found_timeout_us if self.refound_timeout_us is None \
            else self.refound_timeout_us

    @property
    def lost_evidence_us(self) -> int:
        return 40 * self.timeout_base_us if self.lost_evidence_after_us is None \
            else self.lost_evidence_after_us

    @property
    def extension_cap_us(self) -> int:
        return 3 * self.timeout_base_us if self.adaptive_cap_us is None else self.adaptive_cap_us

    def fault_timeout_us(self, rank: int) -> int:
        return fault_timeout_us(rank, timeout_base_us=self.timeout_base_us,
                                inaction_us=self.timeout_base_us if self.inaction_us is None
                                else self.inaction_us,
                                skew_us=self.timeout_base_us if self.skew_us is None
                                else self.skew_us)


# ---- actions ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MembershipChanged:
    """This replica installed a membership (for status, checks, and the runtime)."""
    birth: int
    pvn: int
    change: int
    members: tuple[Key, ...]     # primary first, then backups by precedence (= rank order)
    my_rank: int
    reason: str = ""             # why, for people reading logs (not part of the protocol)


@dataclass(frozen=True, slots=True)
class ViewEntered:
    """This replica knows that the primary view `pvn` of `primary` formed (phase 1 is
    over): from here on it no longer accepts a competing proposal for `pvn`. The runtime
    also reports it, through `view_entered(pvn)`, when a backup reaches the order-info
    entry that starts the view (whichever comes first)."""
    birth: int
    pvn: int
    primary: int


@dataclass(frozen=True, slots=True)
class BeginPhase2:
    """Phase 1 is over (or the group was founded): run NewPrimaryView on every
    inter-group connection, then call `phase2_complete(pvn)` at the virtual synchrony
    point."""
    pvn: int
    members: tuple[Key, ...]


@dataclass(frozen=True, slots=True)
class ViewStarted:
    """The new primary view starts here: reset message sequence numbers, set the
    messaging view, and emit the order-info entry that switches the backups over."""
    pvn: int
    members: tuple[Key, ...]


@dataclass(frozen=True, slots=True)
class StateRestored:
    nbytes: int


@dataclass(frozen=True, slots=True)
class Reset:
    """Discard the replica's application state (the agent restarts the app) and rejoin
    as a new member: the core already switched to `new_birth`; it sends ProposeBackup
    after `rejoin_after_us` (the back-off; 0: at once)."""
    old_birth: int
    new_birth: int
    reason: str
    rejoin_after_us: int = 0


@dataclass(frozen=True, slots=True)
class JoinRefused:
    """The group's primary will not admit us (`why`, its words): applying again cannot
    help, so the runtime stops with that line. Emitted once per incarnation."""
    primary: int
    why: str


Action = (Send | Pulse | MembershipChanged | ViewEntered | BeginPhase2 | ViewStarted | StateRestored
          | Reset | JoinRefused)


def short_id(birth: int) -> str:
    """A birth id as logs show it: its first 6 hex digits."""
    return f"{birth:x}"[:6]


def describe_change(old: list[Key], new: list[Key]) -> str:
    """'admitted a1b2c3; removed d4e5f6' (the backups that came and went)."""
    before, after = {k.birth for k in old}, {k.birth for k in new}
    parts = []
    if after - before:
        parts.append("admitted " + ", ".join(short_id(b) for b in sorted(after - before)))
    if before - after:
        parts.append("removed " + ", ".join(short_id(b) for b in sorted(before - after)))
    return "; ".join(parts) or "changed nothing"


# ---- internal records ------------------------------------------------------------------

@dataclass
class _Proposal:                 # phase 1 at the self-appointed new primary
    target: int
    change: int
    members: list[Key]
    parent: tuple[int, int]      # (pvn, primary birth id) of the view it replaces
    version_us: int              # when this change of the proposal was first sent
    drop_check_us: int = 0       # next time non-acknowledging members may be dropped
    acked: set[int] = field(default_factory=set)
    sent_us: int = 0
    why: str = ""                # the suspicion that started it (MembershipChanged.reason)
    evidenced: bool = False      # taken on a remote group's word (`_awaiting_evidence`)
    primary_went_on_us: int | None = None   # the old primary last named a later change


@dataclass
class _Change:                   # AcceptBackup / RemoveBackup awaiting acknowledgments
    mtype: MsgType
    change: int
    members: list[Key]
    old_members: list[Key]
    started_us: int
    acked: set[int] = field(default_factory=set)
    sent_us: int = 0


@dataclass
class _Outgoing:                 # State transfer at the primary
    to: int
    chunks: list[bytes]
    acked: set[int] = field(default_factory=set)
    next_new: int = 0            # chunks below this were sent at least once
    sent_us: int = 0


@dataclass
class _Incoming:                 # State reassembly at the joining backup
    chunks: int
    parts: dict[int, bytes] = field(default_factory=dict)


def _encode_members(members: list[Key] | tuple[Key, ...]) -> list[list[int]]:
    return [[k.birth, k.precedence] for k in members]


def _decode_members(raw: list) -> list[Key]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_MEMBERS:
        raise RemoteProtocolError("members: not a list of 1..MAX_MEMBERS")
    out = []
    for m in raw:
        if (not isinstance(m, list) or len(m) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in m)):
            raise RemoteProtocolError("member: not [birth, precedence]")
        out.append(Key(m[1], m[0]))
    if len({k.birth for k in out}) != len(out) or len({k.precedence for k in out}) != len(out):
        raise RemoteProtocolError("members: duplicate birth id or precedence")
    if out != sorted(out):
        raise RemoteProtocolError("members: not in precedence order")
    return out


class Membership:
    """One replica's membership core. Drive it with the sans-IO methods; see the module
    docstring for the protocol and `docs/ARCHITECTURE.md` for the runtime contract."""

    def __init__(self, config: Config, rng: random.Random,
                 state: StateProvider | None = None) -> None:
        self.cfg = config
        self.rng = rng
        self.state = state if state is not None else EmptyState()
        self.rejected = 0                       # malformed membership messages dropped
        self.resets = 0
        self.heartbeats_carried = 0             # ours not needed: another core's stood for it
        self._actions: list[Action] = []
        self._started = False
        # hints that survive a reset: a founder numbers its view and precedence above
        # everything it has heard of, so stale messages of an older history lose
        self.max_seen_precedence = 0
        self.max_seen_pvn = 0
        self._backoff_level = 0          # resets since the last stable membership
        self.founding_held: str | None = None   # hold_founding (survives a reset)
        self.catching_up = False                # set_catching_up (the runtime's knowledge)
        self._replay_done_us = 0                # set_catch_up_estimate (ditto)
        # the remote groups this replica has connections with (the runtime's knowledge,
        # asked only when the detector fires): a takeover needs to hear one of them
        self.remote_groups_of: Callable[[], Iterable[str]] = tuple
        # whether we, primary, serve remote groups: connections, or remote data in this
        # view (the runtime's knowledge; our heartbeats say it, `competing_primary_wins`)
        self.served_of: Callable[[], bool] = bool
        # the wall clock in milliseconds (the runtime's; the simulator's virtual time):
        # names the lineage this replica founds (`rules.lineage_of`); 0: unknown
        self.wall_ms_of: Callable[[], int] = int
        self.takeovers_held = 0                 # suspicions held for want of evidence
        self.takeovers_on_leave = 0             # proposals made because the primary left
        self.probes_alive = 0                   # answers: our primary speaks to them
        self.unevidenced_exclusions = 0         # served primary, not reset by one
        self._become_joiner(0)

    # ---- introspection ------------------------------------------------------------

    @property
    def key(self) -> Key:
        return Key(self.precedence, self.birth)

    @property
    def primary(self) -> Key | None:
        return self.members[0] if self.members else None

    @property
    def rank(self) -> int:
        """1 for the primary, 2..n for the backups by precedence, 0 when not a member."""
        return self._rank_of(self.birth)

    def _rank_of(self, birth: int) -> int:
        """`birth`'s rank in our view, as `rank` is ours (0: not a member)."""
        for i, k in enumerate(self.members):
            if k.birth == birth:
                return i + 1
        return 0

    def is_member(self) -> bool:
        return self.status in MEMBER_STATUSES

    # ---- the sans-IO interface --------------------------------------------------------

    def start(self, now_us: int) -> None:
        """Begin: apply for membership (or found the group if nobody answers)."""
        self._started = True
        self._become_joiner(now_us)
        self._send_propose_backup(now_us)

    def take_actions(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    def next_timer_us(self, watched: bool = True) -> int | None:
        """The next deadline; `watched` False: leaving out those `silence_watches` gives
        (a driver whose pulse thread watches them wakes for the others only)."""
        return self.deadlines()[0 if watched else 1]

    def silence_watches(self) -> list[tuple[int, int, int]]:
        """The deadlines of `next_timer_us` that only a peer's silence can bring:
        (birth, heard_us, deadline_us), each "last heard + allowance", so a copy of the
        peer's heartbeat that came at `heard_us + d` moves it by `d` (a thread that
        follows the copies it absorbs, llft/runtime/pulse.py, wakes the driver only
        when one passes). Only deadlines that move one for one with that peer alone are
        watches (not a backup's detector held by a senior's wait or its own replay, nor
        one on a peer never heard). Moving with its copies, a watch is late by at most
        how much the peer's allowance shrank meanwhile (its arrival history calmed,
        detector.py), until the driver's next event hands the copies in and takes the
        watches anew."""
        return self.deadlines()[2]

    def deadlines(self) -> tuple[int | None, int | None, list[tuple[int, int, int]]]:
        """(`next_timer_us()`, `next_timer_us(watched=False)`, `silence_watches()`) in
        one pass: a replica node asks for them after every change, and the detectors'
        extensions are the dear part."""
        if not self._started:
            return None, None, []
        c = self.cfg
        t = []
        if self.status is Status.JOINING:
            # ticking every interval, as members do, lets `_observe_clock` tell a
            # local stall from a long back-off
            if self._last_tick_us is not None:
                t.append(self._last_tick_us + c.heartbeat_interval_us)
            t.append(self._join_sent_us + c.join_retry_us)
            if self.founding_held is None:
                # (while the runtime holds founding, a deadline already past would be
                # due at once, again and again: the joiner spun at 100% of a core)
                t.append(self._found_deadline_us())
            return min(t), min(t), []
        t.append(self._hb_due_us)
        # ticks every interval, or every refresh of another core's heartbeat that stands
        # for ours (`heartbeat_carried`): `_observe_clock` tells a local stall by the gap
        tick = self._last_tick_us if self._last_tick_us is not None else self._hb_sent_us
        t.append(tick + self._tick_period_us)
        watches = []
        if self.status in (Status.BACKUP, Status.AWAITING_STATE):
            (fd, alone), held = self._fd_deadline(), self._takeover_held_us
            heard = self._last_heard.get(self.primary.birth)
            if held is not None and fd <= held:
                t.append(self._probe_due_us)
            elif alone and heard is not None and self.is_member():
                watches.append((self.primary.birth, heard, fd))
            else:
                t.append(fd)
        elif self.status is Status.PROPOSING:
            p = self._proposal
            t.append(p.sent_us + c.retransmit_us)
            t.append(self._drop_due_us(p))
        else:
            heard = self._last_heard
            for k in self.members[1:]:
                b = k.birth
                if b in heard:
                    watches.append((b, heard[b], heard[b] + self._backup_timeout_us(b) + 1))
                else:
                    t.append(self._backup_timeout_us(b) + 1)    # never heard: due now
            t.extend(self._primary_deadlines())
        unwatched = min(t)
        return min([unwatched] + [w[2] for w in watches]), unwatched, watches

    def _observe_clock(self, now_us: int, *, tick: bool) -> None:
        """Called first on every event (timer or message). Once the timer has run, it
        is due at least every heartbeat interval, so a longer gap since its last run
        means THIS replica was not running (a starved or paused process): the silence
        it would now blame on its peers is its own. Their messages are still queued in
        its socket, behind whichever event runs first (a timer, or one message whose
        handler judges the others: an ack that ticks the primary, say); so the stalled
        time counts against no one (`_forgive_stall`), whichever path sees it first.
        Detection of a real failure is delayed by at most the stall."""
        last = self._last_tick_us
        if last is not None:
            hb = self.cfg.heartbeat_interval_us
            stall = now_us - last - STALL_SLACK_INTERVALS * hb - (self._tick_period_us - hb)
            if stall > 0:
                self._forgive_stall(stall, now_us)
                tick = True                       # forgiven once, from here on
        if tick:
            self._last_tick_us = now_us if last is None else max(last, now_us)

    def _forgive_stall(self, stall_us: int, now_us: int) -> None:
        def later(t: int) -> int:                 # past anchors move, never beyond now
            return t if t >= now_us else min(now_us, t + stall_us)
        self.stalls += 1
        for b, t in self._last_heard.items():
            self._last_heard[b] = later(t)
        for st in self._arrivals.values():
            st.shift(stall_us, now_us)            # our pause is no gap of theirs
        if self._pending is not None:
            self._pending.started_us = later(self._pending.started_us)
        if self._proposal is not None:
            p = self._proposal
            p.version_us = later(p.version_us)
            p.drop_check_us = later(p.drop_check_us)
        self._group_heard_us = later(self._group_heard_us)
        if self._behind_since_us is not None:
            self._behind_since_us = later(self._behind_since_us)
        self._primary_spoke_us = later(self._primary_spoke_us)
        self._join_start_us = later(self._join_start_us)
        for b, t in self._other_joiners.items():
            self._other_joiners[b] = later(t)

    def handle_timer(self, now_us: int) -> None:
        if not self._started:
            return
        c = self.cfg
        self._observe_clock(now_us, tick=True)
        if self.status is Status.JOINING:
            self._joiner_tick(now_us)
            return
        if now_us >= self._hb_due_us:
            self._own_heartbeat(now_us)                         # nobody carries ours
        if self.status in (Status.BACKUP, Status.AWAITING_STATE):
            if now_us >= self._fd_deadline_us():
                self._fault_detector_fired(now_us)
        elif self.status is Status.PROPOSING:
            self._proposal_tick(now_us)
        else:
            self._primary_tick(now_us)

    def handle_message(self, msg: Message, now_us: int) -> None:
        if not self._started or msg.sender == self.birth:
            return
        if msg.src_group != self.cfg.group or msg.dst_group != self.cfg.group:
            return
        handler = self._HANDLERS.get(msg.type)
        if handler is None:
            return
        self._observe_clock(now_us, tick=False)
        self._note_sender(msg, now_us)
        try:
            if self.is_member() and self._competing_primary(msg, now_us):
                return
            handler(self, msg, now_us)
        except RemoteProtocolError:
            self.rejected += 1

    def view_entered(self, pvn: int, now_us: int) -> None:
        """A backup reached the order-info entry that starts view `pvn`."""
        if self.is_member() and pvn == self.pvn:
            self._enter_view()

    def heartbeat_carried(self, msg: Message | None, now_us: int,
                          until_us: int | None = None) -> None:
        """Another core of this replica sent `msg` to the group (messaging's HEARTBEAT,
        while it is live), repeated by the driver until `until_us` (a `Pulse`; None: sent
        once). A receiver's membership reads of a HEARTBEAT only its header (pvn,
        precedence, sender) and `rank`: if those are what ours would say, it stands for
        ours, and ours waits. Ours is then due half an interval after the other's last
        copy, so a tie goes to the other core and a core that stops leaves a gap of at
        most 1.5 intervals.

        It is also this core's tick (the loop ran: `_observe_clock`), and while it
        stands for ours our next tick falls due with the other core's next refresh: an
        idle agent's cost is its wake-ups, and a quiet member's loop wakes only for those
        refreshes and for its detectors' deadlines."""
        if not (self._started and msg is not None and msg.type is MsgType.HEARTBEAT
                and msg.sender == self.birth):
            return
        self._observe_clock(now_us, tick=True)
        if (self.is_member() and msg.pvn == self.pvn and msg.precedence == self.precedence
                and all(msg.body.get(k) == v for k, v in self._heartbeat_body().items())):
            hb = self.cfg.heartbeat_interval_us
            self._heartbeat_sent(now_us, hb // 2)
            if until_us is not None and until_us > now_us:
                self._hb_due_us = until_us + hb // 2
                self._tick_period_us = max(hb, until_us - now_us)
            else:
                self._tick_period_us = hb
            self.heartbeats_carried += 1

    def heard_again(self, msg: Message, times_us: list[int]) -> None:
        """Byte-identical copies of `msg` arrived at `times_us` (ascending, none after
        now), absorbed by the driver without waking its loop (messages.Pulse): each is
        noted as heard when it came, and the last is handled as any message (a handler
        that answers a repeated message, say the primary telling a removed replica its
        membership, answers it once per batch)."""
        self.note_copies(msg, times_us[:-1])
        self.handle_message(msg, times_us[-1])

    def note_copies(self, msg: Message, times_us: list[int]) -> None:
        """What copies of `msg` arriving at `times_us` say: that its sender lived then
        (liveness and arrival history, `_note_sender`), nothing more."""
        if not (self._started and times_us and msg.sender != self.birth
                and msg.src_group == self.cfg.group and msg.dst_group == self.cfg.group
                and msg.type in self._HANDLERS):
            return
        for t in times_us:
            self._note_sender(msg, t)

    def hold_founding(self, why: str | None) -> None:
        """The runtime knows of a live member of this group that we cannot hear (on this
        host: paused, or busy): while `why` is set, a joiner keeps asking to join and
        does not found the group anew (two lineages: one of them would lose its state)."""
        self.founding_held = why

    def set_catching_up(self, flag: bool) -> None:
        """The runtime's application is replaying the history this member joined with
        (not yet within the lag bound). Meanwhile every timeout of ours on a peer waits
        floor + cap: the replay is this machine's heaviest work (a JVM driver replaying
        20,000 entries keeps both cores busy), so silences are likelier ours than the
        peers', and a takeover by us would be slow anyway (the whole rest of the replay
        before the application can answer: 80 s in a 3-replica Spark run whose
        catching-up backup replaced a live primary). The receiving side of the
        primary's protection of a member it just gave its state (`_receiving_state`)."""
        self.catching_up = flag

    def backups_replaying(self) -> set[int]:
        """At the primary: the backups whose last HEARTBEAT said `replay`."""
        return set(self._replaying) if self.status in PRIMARY_STATUSES else set()

    def restoring(self, birth: int) -> bool:
        """At the primary: `birth` has not yet replayed the state it joined with (it waits
        for it, gets it, settles after it, or its HEARTBEAT says `replay`)."""
        return self._receiving_state(birth)

    def replay_flag(self) -> int:
        """What our HEARTBEAT's `replay` says: 1 while we are a backup catching up (our
        primary then gives us its longest timeouts: `_receiving_state`)."""
        return int(self.catching_up and self.status is Status.BACKUP)

    def set_catch_up_estimate(self, us: int, now_us: int) -> None:
        """The runtime's estimate, at `now_us`, of how long its application needs to
        execute what it was given (0: nothing left). Our detector on the primary does not
        fire before that replay would end: a takeover could not serve sooner anyway, and
        a primary that was only paused (a GC, a swapped-out VM) resumes meanwhile and
        nothing changes. The estimate is renewed as the replay proceeds, so a dead
        primary is replaced when the replay is nearly done, no later than before; and
        never later than `catch_up_wait_max_us` after it fell silent (an app that makes
        no progress). A Spark backup that had just rejoined replaced a primary paused for
        1.6 s and left the clients without a reply for 25 s: its cold JVM's replay."""
        self._replay_done_us = now_us + int(us) if us > 0 else 0

    @property
    def takeover_held(self) -> bool:
        """The detector fired and waits for evidence (the runtime then hands over the
        answers to our PROBEs: `probe_answered`)."""
        return self._takeover_held_us is not None

    def probe_answered(self, primary: int, pvn: int, ago_us: int, now_us: int,
                       quiet_us: int = 0, size: int = 0, listen_us: int = LONG_QUIET_US) -> None:
        """A remote group's member answered our PROBE: it last heard our group's primary
        `primary` (birth id, 0: never) of view `pvn` `ago_us` before it answered, and a
        majority of its own group's view of `size` members `quiet_us` before
        (`probe_state`); it has listened for `listen_us`."""
        if self._takeover_held_us is None or self.status is not Status.BACKUP:
            return
        self._observe_clock(now_us, tick=False)
        if now_us < self._fd_deadline_us():
            return
        mine, c = self.primary.birth, self.cfg
        if self._outlived_by == mine:
            return              # it served them long after it fell silent to us (below)
        if now_us - self._primary_spoke_us < c.timeout_base_us and not self._left():
            self.probes_alive += 1              # its heartbeats are late, but it speaks
            return
        if (primary and pvn < self.pvn
                and listen_us < now_us - max(self._primary_heard_us(), self._primary_spoke_us)):
            # a primary of an earlier view of ours speaks to them, but they began to
            # listen after ours fell silent to us: not hearing of our view says nothing
            # of whether it went somewhere (a member restarted since answered so about
            # a primary cut off alone through our view, which still spoke after the heal,
            # and we waited for ever: replica_fresh_answer_names_an_older_primary)
            return
        if primary and (pvn > self.pvn or (pvn == self.pvn and primary != mine)
                        or (primary != mine and ago_us < c.live_remote_silence_us)):
            # another primary of ours serves them: of a later view, or of the same or an
            # earlier one lately (the view we are in may be a branch that went nowhere:
            # the competing-primary rule settles it, a takeover would fork it again)
            self.probes_alive += 1
            self._served_elsewhere_us = now_us
            return
        if primary == mine:
            # when it spoke to them, against when it fell silent to us: its last message
            # of any kind to our group (under load its heartbeats come late while its
            # order info still flows), or, if its heartbeats named a membership change
            # we never got, when that began (a primary heard again after it removed us,
            # before we learn that, leaves our state as stale as the removal)
            silent_us = max(self._primary_heard_us(),
                            self._primary_spoke_us)
            limit_us = c.timeout_base_us + self._extension_us(mine, c.timeout_base_us)
            # ... and less than the primary removes a backup after (as its HEARTBEATs
            # said: `removal_wait_ms`; not yet said: the floor), less the heartbeats it
            # may have heard from us after we last heard it: serving them that long
            # after, it may have removed us and served what we do not hold. (A backup
            # that did not hear the heartbeat naming its removal judged by its own
            # extension for the primary, 100 ms, where the primary removed it after
            # 50: replica_behind_backup_takes_over_after_a_short_heal, in other timing)
            said_by, removal_us = self._primary_rm
            if said_by != mine or not removal_us:
                removal_us = min(c.backup_timeout_us, c.ack_timeout_us)
            limit_us = min(limit_us, removal_us - 2 * c.heartbeat_interval_us)
            if self._behind_since_us is not None:
                silent_us = min(silent_us, self._behind_since_us)
                # (and no extension: its timing does not explain a change it made without
                # us. A backup just admitted is judged by the slowest peer it knows, up to
                # the cap: a primary that served them 97 ms after it removed us was under
                # a 100 ms limit -- replica_behind_backup_takes_over_after_a_short_heal)
                limit_us = c.timeout_base_us
            after_us = now_us - ago_us - silent_us
            if after_us > limit_us:
                # a whole detector timeout after (as extended for this primary's observed
                # timing): no crash explains that (its messages to us would all have been
                # lost); we were cut off while it served them,
                # so our state lacks what they saw. Never take over from it: the branch
                # that served them (or its successor) prunes ours when we hear it. Never
                # means never: a later answer that it is silent now (it crashed since;
                # or a remote member restarted since, that never heard it) is true and
                # still leaves our state stale; the member that kept up takes over and
                # its proposal resets us (replica_removed_backup_outranks_the_state)
                self._outlived_by = mine
                self.probes_alive += 1
                return
            if (after_us > 2 * c.heartbeat_interval_us
                    and ago_us < c.live_remote_silence_us):
                self.probes_alive += 1          # it speaks to them lately, not to us
                return
        elif ago_us < c.timeout_base_us:
            return      # it never heard our primary, nor listened long enough to tell
        if self._answer_is_lost(quiet_us, now_us) and not self._lost_answer_counts(size,
                                                                                 now_us):
            return
        if now_us - self._served_elsewhere_us < c.live_remote_silence_us:
            # another answer said lately that a primary of ours serves them: this one,
            # that ours is silent, comes from a member that has not heard it (one just
            # back from a cut it shared with us: it hears its majority again, quiet 0,
            # but what it knows of us is as old as the cut). Taking over would fork the
            # group again, from our stale state (replica_machine_cut_stale_answer_after_heal)
            self.probes_alive += 1
            return
        self._evidence_us = now_us
        self._fault_detector_fired(now_us)

    def probe_state(self, now_us: int, since_us: int | None = None) -> tuple[int, int]:
        """What our PROBE answers add about ourselves: (quiet, size): how long ago we
        last heard a strict majority of our own view of `size` members (counting
        ourselves; 0 for a group of one). If that is as long as the asker has not heard
        its primary, our word that its primary is silent may only mean that both of us
        are on the cut-off side (`_answer_is_lost`). A replica not a member hears no
        majority. `since_us`: when we last heard the asker's primary (what the answer
        covers): a period without a majority that reached into that time counts as if
        it went on (we may hear a majority again, just back from a cut shared with the
        asker, while what we know of its group is as old as the cut)."""
        if not self.is_member():
            return LONG_QUIET_US, 0
        quiet = self._majority_quiet_us(now_us)
        if self._last_quiet is not None and since_us is not None \
                and self._last_quiet[1] >= since_us:
            quiet = max(quiet, now_us - self._last_quiet[0])
        return min(LONG_QUIET_US, quiet), self._quorum_base

    def _majority_heard_us(self) -> int:
        """When we last heard a strict majority of the largest membership of our view
        (counting ourselves; a group of one: always)."""
        need = self._quorum_base // 2           # others besides us for a strict majority
        if need == 0:
            return 1 << 62
        heard = sorted((self._last_heard.get(k.birth, -(1 << 62)) for k in self.members
                        if k.birth != self.birth), reverse=True)
        latest = heard[need - 1] if len(heard) >= need else -(1 << 62)
        return max(latest, self._majority_kept_us)

    def _majority_quiet_us(self, now_us: int) -> int:
        """How long we have not heard a strict majority of our view (0: we hear one)."""
        quiet = now_us - self._majority_heard_us()
        return quiet if quiet >= self._silence_allowed_us() else 0

    def _hears_majority(self, now_us: int) -> bool:
        """We heard a strict majority of our view lately (our own detector's sense:
        within two heartbeat intervals of the most we allow our primary), and not only
        just now after a period without one: back from a cut, we may hear a backup of
        ours before our primary, which lives, speaks again (its next heartbeat is up to
        an interval away); hearing them for two intervals tells the two apart
        (replica_machine_cut_majority_heard_before_the_primary)."""
        return self._majority_quiet_us(now_us) == 0 and (
            self._last_quiet is None
            or now_us - self._last_quiet[1] >= 2 * self.cfg.heartbeat_interval_us)

    def _silence_allowed_us(self) -> int:
        return self.cfg.fault_timeout_us(2) - 2 * self.cfg.heartbeat_interval_us

    def _answer_is_lost(self, quiet_us: int, now_us: int) -> bool:
        """The answerer has not heard a majority of its group for about as long as we
        have not heard our primary (or longer): it is likely cut off with us."""
        return (quiet_us + 2 * self.cfg.heartbeat_interval_us
                >= now_us - self._primary_heard_us())

    def _lost_answer_counts(self, size: int, now_us: int) -> bool:
        """An answer from a remote member that is itself lost (`_answer_is_lost`) is evidence
        that its side, which may be ours, does not hear our primary. A machine cut takes
        one replica of each group: the two backups so cut off each said the other's
        primary was silent, both took over, and the heal kept the minority's branches,
        or, with a restart among them, branches that had not served each other
        (replica_machine_cut_serves_a_fresh_lineage). It counts when we hear a majority
        of our own view (the majority side takes over: a machine that died with both
        primaries), when neither group has a majority to find (two members or fewer:
        the paper's availability, as before), or once we have held for
        `lost_evidence_us` (three crashes leave a survivor that hears no majority)."""
        if self._hears_majority(now_us):
            return True
        if self._quorum_base <= 2 and size <= 2:
            return True
        held = self._takeover_held_us
        return held is not None and now_us - held >= self.cfg.lost_evidence_us

    @property
    def primary_spoke_us(self) -> int:
        """When our primary last spoke to our group (any message, `primary_spoke`; -1:
        not since this incarnation joined)."""
        return self._primary_spoke_us

    def primary_spoke(self, now_us: int) -> None:
        """The runtime heard a message of any kind from our primary to our group (the
        core itself sees only heartbeats and membership messages)."""
        self._primary_spoke_us = max(self._primary_spoke_us, now_us)

    def abandon(self, reason: str, now_us: int) -> None:
        """The replica's state cannot go on in this group (its application executed
        what the group's history does not hold): rejoin as a new member."""
        if self.is_member():
            self._reset(now_us, reason)

    def phase2_complete(self, pvn: int, now_us: int) -> None:
        """The messaging layer reached the virtual synchrony point of view `pvn`."""
        if self.status is not Status.PRIMARY_PHASE2 or pvn != self.pvn:
            return                                   # superseded meanwhile: nothing starts
        self.status = Status.PRIMARY
        self._emit(ViewStarted(self.pvn, tuple(self.members)))
        self._primary_tick(now_us)

    # ---- common helpers -----------------------------------------------------------------

    def _emit(self, action: Action) -> None:
        if len(self._actions) >= MAX_ACTIONS:
            raise RuntimeError(f"more than MAX_ACTIONS={MAX_ACTIONS} actions not taken")
        self._actions.append(action)

    def _heartbeat_body(self) -> dict:
        """What our HEARTBEAT says beyond its header (messaging's says the same when it
        stands for ours: `heartbeat_carried`; it adds its own `done`, 0 in ours)."""
        return {"rank": self.rank,
                "served": int(self.status in PRIMARY_STATUSES and self.served_of()),
                "lineage": self.lineage, "change": self.change,
                "wait": self.detector_wait_ms(), "replay": self.replay_flag(),
                "rm": self.removal_wait_ms()}

    def heartbeat_news(self, now_us: int) -> None:
        """Something our HEARTBEAT says changed outside this core (our branch became
        served: `served_of`): ours goes at once, as at a membership change (`_install`),
        instead of a repetition of the last saying otherwise for up to a refresh. A
        primary heard by a competing one after a heal said "not served" for that long
        while it served, so the competitor's empty branch kept its place and the clients
        followed its higher view (replica_heal_stale_served_heartbeat)."""
        if self._hb_due_us > now_us:
            self._hb_due_us = now_us

    def _heartbeat_sent(self, at_us: int, slack_us: int = 0) -> None:
        self._hb_sent_us = at_us
        self._hb_due_us = at_us + self.cfg.heartbeat_interval_us + slack_us

    def _own_heartbeat(self, now_us: int) -> None:
        """Our HEARTBEAT, when no other core's stands for it. A primary alone (a group of
        one: nobody's detector to feed, nobody to watch) says it as a `Pulse`, the same
        message refreshed every `pulse_intervals` intervals while it says the same, so
        its loop wakes as a quiet member's does; everyone else every interval."""
        c = self.cfg
        hb, k, g = c.heartbeat_interval_us, c.pulse_intervals, c.group
        msg = self.message(MsgType.HEARTBEAT, {**self._heartbeat_body(), "done": 0})
        if k > 1 and self.status is Status.PRIMARY and len(self.members) == 1:
            quiet = msg == self._last_own_hb
            self._last_own_hb = msg
            self._emit(Pulse(g, msg, hb, now_us + pulse_until_us(k, hb), pulse_lease_us(hb)))
            self._heartbeat_sent(now_us, (k - 1) * hb if quiet else 0)
            self._tick_period_us = pulse_until_us(k, hb)
        else:
            self._last_own_hb = None
            self._emit(Send(g, msg))
            self._heartbeat_sent(now_us)
            self._tick_period_us = hb

    def message(self, mtype: MsgType, body: dict) -> Message:
        """An intra-group message from us in our view (also the node's, for a joiner
        that has no live messaging yet)."""
        g = self.cfg.group
        return Message(type=mtype, src_group=g, dst_group=g, conn_seq=0, role=Role.CLIENT,
                       pvn=self.pvn, precedence=self.precedence, sender=self.birth, body=body)

    def _send(self, mtype: MsgType, body: dict) -> None:
        self._emit(Send(self.cfg.group, self.message(mtype, body)))

    def _become_joiner(self, now_us: int) -> None:
        self.birth = self.rng.getrandbits(63) or 1
        self.status = Status.JOINING
        self.precedence = 0
        self.pvn = 0
        self.change = 0
        self.lineage = 0                 # our group's lineage (`rules.lineage_of`; 0: none yet)
        self.join_refused = False        # our primary answered REFUSE_BACKUP (JoinRefused)
        self._primary_left: tuple[int, int] | None = None   # (pvn, primary) that sent LEAVE
        self._left_at_us = 0                                 # ... when it came
        self.members: list[Key] = []
        self._quorum_base = 0            # the largest membership of our view (`_install`)
        self._majority_kept_us = now_us  # last heard a majority of it, as of the last change
        self.max_precedence = 0
        self._accepted_by_proposal = False
        self._generated_target: int | None = None
        self._view_parent: tuple[int, int] | None = None     # view ours replaced, if proposed
        self._acked_pp: dict[int, tuple[Key, int]] = {}      # target -> (proposer, change)
        self._seen_pp: dict[int, tuple[Key, Key]] = {}       # target -> (min, max) proposer
        self._last_heard: dict[int, int] = {}
        # a senior backup's HEARTBEAT `wait`: how much longer than its floor its detector
        # on our primary waits (`detector_wait_ms`); ours waits at least as long
        self._senior_wait_us: dict[int, int] = {}
        # (primary, its HEARTBEAT's `rm` in us): how soon it removes a silent backup
        self._primary_rm: tuple[int, int] = (0, 0)
        # members' message timing: kept across our own reset (a peer's timing does not
        # depend on our incarnation), pruned to the members at every install
        self._arrivals: dict[int, ArrivalStats] = getattr(self, "_arrivals", {})
        self._last_tick_us: int | None = None             # the timer's last run
        self._tick_period_us = self.cfg.heartbeat_interval_us   # due between two ticks
        self._last_own_hb: Message | None = None          # our last own Pulse (`_own_heartbeat`)
        self._member_since_us: int | None = None          # this incarnation admitted
        self.stalls = 0                  # local stalls forgiven (`_observe_clock`)
        self._proposal: _Proposal | None = None
        self._pending: _Change | None = None
        self._joiners: deque[int] = deque(maxlen=MAX_PENDING_JOINERS)
        self._needs_state: list[int] = []
        self._settling: dict[int, int] = {}    # state given -> heartbeats still to hear
        self._restoring_us: dict[int, int] = {}  # ... and its restore allowance (settling)
        self._replaying: set[int] = set()      # backups whose HEARTBEAT says `replay`
        self._backups_left: set[int] = set()   # backups that said LEAVE (`_on_leave`)
        self._outgoing: _Outgoing | None = None
        self._incoming: _Incoming | None = None
        self._heartbeat_sent(now_us)
        self._join_sent_us = now_us
        self._join_start_us = now_us
        self._group_heard_us = now_us
        self._other_joiners: dict[int, int] = {}
        self._resent_membership_us = -(1 << 62)
        self._takeover_held_us: int | None = None   # detector fired, no evidence yet
        self._primary_served = False                # our primary's last HEARTBEAT says
        self._primary_spoke_us = -1                 # its last message of any kind
        self._behind_since_us: int | None = None    # its heartbeats name a later change
        self._primary_change_seen = 0               # the latest change they named (a
                                                    # repeated old copy does not undo it)
        self._evidence_us = -1                      # a remote group's last "silent too"
        self._served_elsewhere_us = -(1 << 62)      # an answer's last "another primary
                                                    # of yours serves us" (`probe_answered`),
                                                    # or a member heard in a later view
        self._last_quiet: tuple[int, int] | None = None   # (from, to): our last period
                                                    # without a majority (`probe_state`)
        self._outlived_by: int | None = None        # a primary heard by remote groups a
                                                    # detector timeout after it fell
                                                    # silent to us (`probe_answered`)
        self._probe_due_us = 0
        self._probe_groups: tuple[str, ...] = ()

    def _reset(self, now_us: int, reason: str) -> None:
        """Rejoin as a new member, after a back-off: a replica reset again and again
        (a starved machine, each rejoin loading it more with a state transfer and a
        replay) applies less and less often, so a storm of resets cannot feed itself.
        The first reset (of a fresh replica, or of one that had been a member for
        `rejoin_stable_us`) applies at once: one reset is no storm. Each further one
        waits rejoin_backoff_min_us, then twice that, ... up to rejoin_backoff_max_us,
        jittered (half to all of it, from our rng) so that replicas reset together do
        not apply together."""
        old, c = self.birth, self.cfg
        self.resets += 1
        if (self._member_since_us is not None
                and now_us - self._member_since_us >= c.rejoin_stable_us):
            self._backoff_level = 0
        wait = 0
        if self._backoff_level > 0 and c.rejoin_backoff_max_us > 0:
            cap = min(c.rejoin_backoff_max_us,
                      c.rejoin_backoff_min_us << (self._backoff_level - 1))
            wait = self.rng.randint(cap // 2, cap)
        self._backoff_level = min(MAX_BACKOFF_LEVEL, self._backoff_level + 1)
        self._become_joiner(now_us)
        self._emit(Reset(old, self.birth, reason, wait))
        if wait > 0:
            # silent until then: neither apply nor found the group before applying
            self._join_start_us = self._group_heard_us = now_us + wait
            self._join_sent_us = now_us + wait - c.join_retry_us
        else:
            self._send_propose_backup(now_us)

    def _install(self, pvn: int, change: int, members: list[Key], max_prec: int,
                 now_us: int, reason: str = "") -> None:
        # the majority our PROBE answers speak of is of the largest membership of the view
        # (a primary that removed the backups it cannot hear has not found a majority),
        # and when we last heard one survives the removal (`_majority_heard_us`)
        if pvn == self.pvn and self.members:
            self._majority_kept_us = min(now_us, self._majority_heard_us())
            self._quorum_base = max(self._quorum_base, len(members))
        else:
            self._majority_kept_us = now_us
            self._quorum_base = len(members)
        if not (self.members and members[0] == self.members[0]):
            # what the previous primary's heartbeats said is not the new one's: a backup
            # that had acknowledged a proposer which then reset kept the old primary's
            # `served` and outranked that live, serving primary (still in the view the
            # proposer left) for ever, then took over from the proposer's dead view with
            # the state it had when the cut began (`--random-cuts --partition 0.5 --seed
            # 282001`, schedule 108)
            self._primary_served = False
        self.pvn, self.change, self.members = pvn, change, list(members)
        self._behind_since_us = None
        self._primary_change_seen = change
        # what our heartbeat says changed: another core's that stood for ours may still be
        # repeated (a Pulse, for up to a refresh: ~1 s) with the old change; ours goes at
        # once, and as a newer Pulse (a primary alone) it replaces that repetition (with
        # backups, messaging's own goes at once too, and stands for ours again). A
        # primary that had just removed its last backup was otherwise heard for a second
        # naming the change before, by the removed backup across a short heal, which took
        # itself for current and later took over with its stale state (`llft simulate
        # replica --replay 4759044745088779136 --random-cuts --partition 0.5`)
        if self._hb_due_us > now_us + self.cfg.heartbeat_interval_us:    # (carried)
            self._hb_due_us = now_us
        me = next(k for k in members if k.birth == self.birth)
        self.precedence = me.precedence
        self.max_precedence = max(self.max_precedence, max_prec, members[-1].precedence)
        self._last_heard = {k.birth: self._last_heard.get(k.birth, now_us) for k in members}
        self._arrivals = {k.birth: self._arrivals[k.birth] for k in members
                          if k.birth in self._arrivals}
        self._senior_wait_us = {}                 # ranks changed: seniors speak again
        # (what members said of themselves goes with them, removed here or anywhere)
        self._replaying &= {k.birth for k in members}
        self._backups_left &= {k.birth for k in members}
        if self._member_since_us is None:
            self._member_since_us = now_us
        for t in [t for t in self._acked_pp if t < pvn]:
            del self._acked_pp[t]
        for t in [t for t in self._seen_pp if t < pvn]:
            del self._seen_pp[t]
        self._emit(MembershipChanged(self.birth, pvn, change, tuple(members), self.rank,
                                     reason))

    def _enter_view(self) -> None:
        if self._accepted_by_proposal:
            self._accepted_by_proposal = False
            self._emit(ViewEntered(self.birth, self.pvn, self.primary.birth))

    def _note_sender(self, msg: Message, now_us: int) -> None:
        self.max_seen_precedence = max(self.max_seen_precedence, msg.precedence,
                                       msg.body.get("max_precedence", 0))
        self.max_seen_pvn = max(self.max_seen_pvn, msg.pvn)
        if msg.precedence > 0:
            self._group_heard_us = max(self._group_heard_us, now_us)
        if self.status is Status.JOINING:
            if msg.type is MsgType.PROPOSE_BACKUP:
                self._track_joiner(msg.sender, now_us)
            return
        if (self._accepted_by_proposal and msg.sender == self.primary.birth
                and msg.pvn == self.pvn):
            self._enter_view()          # the primary speaks in the new view: it formed
        if msg.sender in self._last_heard or any(k.birth == msg.sender for k in self._tracked()):
            if self.status in PRIMARY_STATUSES and msg.pvn != self.pvn:
                return          # a backup living in another view is not alive for us
            if self._quorum_base > 1:
                heard = self._majority_heard_us()
                if now_us - heard >= self._silence_allowed_us():
                    self._last_quiet = (heard, now_us)      # a majority-less time, so far
            if (msg.type is MsgType.HEARTBEAT and msg.pvn > self.pvn
                    and self.status is Status.BACKUP):
                # a member of our view speaks in a later view: the group went on without
                # us; no remote word makes our state the group's (`probe_answered`)
                self._served_elsewhere_us = now_us
            before = self._last_heard.get(msg.sender, now_us)
            # (max: absorbed copies are noted after the event that followed them)
            self._last_heard[msg.sender] = max(before, now_us)
            if self.members and msg.sender == self.members[0].birth:
                self._takeover_held_us = None       # the primary speaks: no suspicion
                self._outlived_by = None            # (and what we missed comes again)
                if msg.type is MsgType.HEARTBEAT and msg.pvn == self.pvn:
                    self._primary_served = msg.body.get("served") == 1
                    self._primary_rm = (msg.sender, 1000 * msg.body.get("rm", 0))
                    named = msg.body.get("change", 0)
                    self._primary_change_seen = max(self._primary_change_seen, named)
                    if self._primary_change_seen <= self.change:
                        self._behind_since_us = None
                    elif self._behind_since_us is None:
                        # a membership we never got (we may have been removed): our
                        # state is as old as the last word we had before this one
                        self._behind_since_us = before
            if msg.type is MsgType.HEARTBEAT and self.status in PRIMARY_STATUSES:
                if msg.body.get("replay") == 1:
                    self._replaying.add(msg.sender)
                else:
                    self._replaying.discard(msg.sender)
            left = self._settling.get(msg.sender)
            if left is not None and msg.type is MsgType.HEARTBEAT:
                self._restoring_us.pop(msg.sender, None)    # it speaks: restored
                if left <= 1:
                    del self._settling[msg.sender]
                else:
                    self._settling[msg.sender] = left - 1
            st = self._arrivals.get(msg.sender)
            if st is None:
                if len(self._arrivals) < 2 * MAX_MEMBERS:
                    self._arrivals[msg.sender] = ArrivalStats(
                        now_us, *window_for(self.cfg.heartbeat_interval_us))
            else:
                st.arrived(now_us)

    def _tracked(self) -> list[Key]:
        if self._proposal is not None:
            return self._proposal.members
        return self.members

    def _track_joiner(self, birth: int, now_us: int) -> None:
        self._other_joiners[birth] = now_us
        if len(self._other_joiners) > MAX_TRACKED_JOINERS:
            oldest = min(self._other_joiners, key=self._other_joiners.__getitem__)
            del self._other_joiners[oldest]

    def _competing_primary(self, msg: Message, now_us: int) -> bool:
        """Prune our branch if `msg` comes from a higher primary that is not ours."""
        reveals_primary = (msg.type in PRIMARY_ONLY
                           or (msg.type is MsgType.HEARTBEAT and msg.body.get("rank") == 1))
        if not reveals_primary or msg.precedence <= 0:
            return False
        mine = self.primary
        if mine is not None and msg.sender == mine.birth:
            return False
        theirs = Key(msg.precedence, msg.sender)
        served = (msg.body.get("served") == 1) if msg.type is MsgType.HEARTBEAT else None
        mine_served = (self.served_of() if self.status in PRIMARY_STATUSES
                       else self._primary_served)
        if not competing_primary_wins(mine=mine, theirs=theirs, mine_served=mine_served,
                                      theirs_served=served, mine_lineage=self.lineage,
                                      theirs_lineage=msg.body.get("lineage", 0)):
            return False
        # messaging lines 18-20: make sure the rest of our branch hears it too
        self._emit(Send(self.cfg.group, msg))
        self._reset(now_us, f"competing primary {theirs}{' (served)' if served else ''} "
                            f"of lineage {describe_lineage(msg.body.get('lineage', 0))} "
                            f"outranks {mine}{' (served)' if mine_served else ''} "
                            f"of lineage {describe_lineage(self.lineage)}")
        return True

    # ---- joining (backup-change lines 1-14) --------------------------------------------

    def _send_propose_backup(self, now_us: int) -> None:
        self._send(MsgType.PROPOSE_BACKUP, {"host": self.cfg.host, "pid": self.cfg.pid})
        self._join_sent_us = now_us

    def _found_deadline_us(self) -> int:
        """A joiner founds the group once it has heard no member, and no joiner with a
        higher birth id (which founds first), for `found_timeout_us`; a replica that was
        reset from the group (removed, outranked, excluded, its primary gone before its
        state came) for `refound_timeout_us`. The group it left lived a moment ago: it
        hears nobody more likely because it is cut off from it than because the group
        ended. Founded quickly while cut off, its lineage (empty state, younger) loses
        every heal, but the remote groups it talked to meanwhile follow its higher view
        number, and the serving branch's messages were then stale there: the clients
        stalled (docs/ARCHITECTURE.md open item 9, the refounded-view stall; every
        instance the partition soaks found was a reset replica founding while cut off).
        If the group did end, a reset replica's state was not the group's anyway."""
        quiet = max([self._group_heard_us, self._join_start_us]
                    + [t for b, t in self._other_joiners.items() if b > self.birth])
        return quiet + self._found_wait_us()

    def _found_wait_us(self) -> int:
        return self.cfg.refound_us if self.resets else self.cfg.found_timeout_us

    def _joiner_tick(self, now_us: int) -> None:
        if now_us >= self._found_deadline_us() and self.founding_held is None:
            self._found(now_us)
            return
        if now_us >= self._join_sent_us + self.cfg.join_retry_us:
            self._send_propose_backup(now_us)

    def _found(self, now_us: int) -> None:
        prec = self.max_seen_precedence + 1
        self.status = Status.PRIMARY_PHASE2
        self._heartbeat_sent(now_us - self.cfg.heartbeat_interval_us)
        self.lineage = lineage_of(self.max_seen_pvn + 1, self.wall_ms_of())
        self._install(self.max_seen_pvn + 1, 0, [Key(prec, self.birth)], prec, now_us,
                      f"founded the group: no member heard for "
                      f"{self._found_wait_us() // 1000} ms")
        self._emit(ViewEntered(self.birth, self.pvn, self.birth))
        self._emit(BeginPhase2(self.pvn, tuple(self.members)))

    # ---- backups: fault detector and phase 1 (primary-change lines 1-5, 21-25) ---------

    def _extension_us(self, birth: int, reference_us: int) -> int:
        """How much longer than configured a timeout on `birth` waits (detector.py).
        A peer with too short a history (just admitted, or the primary of a view we
        just joined) is judged by the slowest peer we know well: on a busy machine
        every process shows it."""
        st = self._arrivals.get(birth)
        if self.catching_up or self.status is Status.AWAITING_STATE:
            return self.cfg.extension_cap_us    # our own state is on its way, or replaying
        if self._receiving_state(birth):
            return self.cfg.extension_cap_us + self._restoring_us.get(birth, 0)
        if st is None or not st.known():
            st = max((s for s in self._arrivals.values() if s.known()),
                     key=ArrivalStats.expected_silence_us, default=st)
        return extension_us(st, reference_us, self.cfg.extension_cap_us)

    def _receiving_state(self, birth: int) -> bool:
        """At the primary: `birth` is waiting for our state, getting it, settling after
        it (fewer than SETTLING_HEARTBEATS heard since its last acknowledgment: its
        runtime then starts the application and hands it the whole log), or its
        application still replays that log (its HEARTBEAT says `replay`). Receiving,
        restoring and replaying the group's whole log is the heaviest time of a
        replica's life (a cold JVM driver replaying 36,000 entries kept both cores busy
        for 93 s, and its loop woke 208 ms late once); a removal then throws the replay
        away and starts it again with a longer log, so until it has caught up such a
        member gets the longest timeouts (floor + cap)."""
        if self.status not in PRIMARY_STATUSES:
            return False
        out = self._outgoing
        return (birth in self._needs_state or birth in self._settling
                or birth in self._replaying or (out is not None and out.to == birth))

    def _primary_heard_us(self) -> int:
        """When we last heard our primary (before any word: when we last spoke)."""
        return self._last_heard.get(self.primary.birth, self._hb_sent_us)

    def _fd_deadline_us(self) -> int:
        return self._fd_deadline()[0]

    def _fd_deadline(self) -> tuple[int, bool]:
        """The detector's deadline, and whether it is the primary's silence alone (last
        heard + floor + extension: `silence_watches`)."""
        # every rank extends by what the rank-2 floor would: the ranks keep their order
        c, p = self.cfg, self.primary.birth
        if self._left() and self.rank == 2:
            return self._left_at_us, False      # it said so: no silence to wait for
        heard = self._primary_heard_us()
        floor = c.fault_timeout_us(max(2, self.rank))
        fire = heard + floor
        own = fire + self._extension_us(p, c.timeout_base_us)
        deadline = max(own, min(self._replay_done_us, fire + c.catch_up_wait_max_us))
        for s, wait in self._senior_wait_us.items():
            # a senior backup whose own detector waits longer (it is replaying, or
            # catching up: `_extension_us`) is still to take over first, as the ranks
            # say: we wait as much beyond our floor. Unless it falls silent itself, as
            # long as it would take us to suspect a primary: then it is dead too, and
            # our proposal leaves it out (line 4 of the paper).
            alive_until = (self._last_heard.get(s, heard) + floor
                           + self._extension_us(s, c.timeout_base_us))
            deadline = max(deadline, min(fire + wait, alive_until,
                                         fire + c.catch_up_wait_max_us))
        return deadline, deadline == own

    def detector_wait_ms(self) -> int:
        """How much longer than its rank's floor our detector on the primary waits now,
        in ms rounded up (0 but for a backup). Our HEARTBEAT says it (`wait`), so that a
        junior backup, whose floor is later than ours, does not suspect the primary
        before we do and exclude us. Without it a backup replaying a backlog (held by
        its catch-up estimate, or catching up: the longest extension) was excluded by
        the rank-3 backup's takeover and reset (tests/processes/test_busy_machine.py,
        about one run in five under CPU hogs)."""
        if self.status is not Status.BACKUP or self.rank < 2:
            return 0
        heard = self._primary_heard_us()
        wait_us = self._fd_deadline_us() - heard - self.cfg.fault_timeout_us(self.rank)
        return max(0, -(-wait_us // 1000))

    def removal_wait_ms(self) -> int:
        """A primary's shortest removal timeout on any of its backups now (silence, or
        a change not acknowledged: each floor plus that backup's extension), in ms
        rounded down to REMOVAL_WAIT_STEP_MS (so that it changes rarely: a HEARTBEAT
        that says the same is absorbed without waking its receivers); 0 but for a
        primary with backups. Our HEARTBEAT says it (`rm`): a backup cut off from us
        takes our serving the remote groups for longer than that after we fell silent
        to it as its removal (`probe_answered`)."""
        if self.status not in PRIMARY_STATUSES or len(self.members) < 2:
            return 0
        c = self.cfg
        us = min(min(self._backup_timeout_us(k.birth),
                     c.ack_timeout_us + self._extension_us(k.birth, c.ack_timeout_us))
                 for k in self.members[1:])
        return us // 1000 // REMOVAL_WAIT_STEP_MS * REMOVAL_WAIT_STEP_MS

    def _ack_timeout_us(self, births) -> int:
        """The ack timeout of a change for these members: the longest of theirs."""
        c = self.cfg
        return c.ack_timeout_us + max((self._extension_us(b, c.ack_timeout_us) for b in births),
                                      default=0)

    def _fault_detector_fired(self, now_us: int) -> None:
        if self.status is Status.AWAITING_STATE:
            self._reset(now_us, "primary failed before our state arrived")
            return
        target = self.pvn + 1
        seen = self._seen_pp.get(target)
        if not may_propose(my_key=self.key, seen_min=seen[0] if seen else None):
            self._last_heard[self.primary.birth] = now_us     # a senior backup is on it
            return
        if self._awaiting_evidence(now_us):
            return
        members = proposal_members(self.members, self.primary, self.key)
        self._generated_target = target
        if self._left():
            self.takeovers_on_leave += 1
        heard = self._primary_heard_us()
        # the timeout that applied, beside the silence: a takeover from a live primary
        # then says whether the detector had room (an extended timeout) or none
        why = (f"primary {short_id(self.primary.birth)} of view {self.pvn} left (it said so "
               f"as it stopped, {(now_us - heard) // 1000} ms ago)" if self._left() else
               f"primary {short_id(self.primary.birth)} of view {self.pvn} silent for "
               f"{(now_us - heard) // 1000} ms (timeout "
               f"{(self._fd_deadline_us() - heard) // 1000} ms)")
        self._proposal = _Proposal(target, 0, members, (self.pvn, self.primary.birth),
                                   version_us=now_us, evidenced=bool(self.remote_groups_of()),
                                   drop_check_us=now_us + self._ack_timeout_us(
                                       k.birth for k in members[1:]), why=why)
        self.status = Status.PROPOSING
        for k in members:
            self._last_heard.setdefault(k.birth, now_us)
        self._send_proposal(now_us)
        self._check_phase1(now_us)

    def _left(self) -> bool:
        """Our view's primary said it stopped for good (LEAVE)."""
        return bool(self.members) and self._primary_left == (self.pvn, self.primary.birth)

    def _awaiting_evidence(self, now_us: int) -> bool:
        """Takeover needs evidence (beyond the paper). A backup cannot tell its primary's
        crash from its own isolation, and a backup cut off from the serving primary and
        its clients that takes over starts a branch of its own with a higher precedence
        than the serving primary's, which wins on the heal: the replies the clients had
        from the serving branch are rolled back (docs/ARCHITECTURE.md open item 9).
        So while this replica has connections with remote groups (clients that may have
        seen output), it proposes only when one of them says, after the detector fired,
        that it does not hear our primary either: each remote group is sent a PROBE
        every retransmit interval, and every member answers with what it last heard of
        our primary (a live primary speaks to each remote group at least every
        keep-alive interval). An answer that our primary spoke to them after it fell
        silent to us, and lately, means we are the one cut off: we keep waiting (the
        serving primary removes us; on the heal we hear it and rejoin). A remote group
        whose primary died with ours still answers (its backups do), and counts our
        PROBEs as nothing. With no remote connection nobody can have seen output: the
        takeover proceeds as the paper's. A primary that said it left (LEAVE) is asked
        about too: it serves no more, but a backup cut off from the clients must still
        not take over on its word while another, with them, takes over after its own
        detector (two successors, and the heal keeps the one the clients did not see:
        `llft simulate replica --leave 0.7 --partition 0.3 --replay 11726639226745818027`
        rolled replies back when the word sufficed)."""
        held = self._takeover_held_us
        if held is None or self._fd_deadline_us() > held:      # a new suspicion
            groups = tuple(self.remote_groups_of())
            if not groups:
                self._takeover_held_us = None
                return False
            self._takeover_held_us = now_us
            self.takeovers_held += 1
            self._probe_groups = groups[:MAX_PROBED_GROUPS]   # (asked once: O(connections))
            self._probe(now_us)
            return True
        if self._evidence_us > held:
            self._takeover_held_us = None
            return False
        if now_us >= self._probe_due_us:
            self._probe(now_us)
        return True

    def _probe(self, now_us: int) -> None:
        g = self.cfg.group
        for remote in self._probe_groups:
            self._emit(Send(remote, probe(g, remote, pvn=self.pvn,
                                          precedence=self.precedence, sender=self.birth)))
        self._probe_due_us = now_us + self.cfg.retransmit_us

    def _send_proposal(self, now_us: int) -> None:
        p = self._proposal
        self._send(MsgType.PROPOSE_PRIMARY, {
            "members": _encode_members(p.members), "old_pvn": p.parent[0],
            "old_primary": p.parent[1], "change": p.change, "evidenced": int(p.evidenced),
            "max_precedence": self.max_precedence})
        p.sent_us = now_us

    def _drop_due_us(self, p: _Proposal) -> int:
        """When members that did not acknowledge may next be dropped: not while the
        primary we replace names a later change than ours (`_on_heartbeat`)."""
        went_on = p.primary_went_on_us
        if went_on is None:
            return p.drop_check_us
        return max(p.drop_check_us, went_on + self.cfg.timeout_base_us)

    def _proposal_tick(self, now_us: int) -> None:
        p, c = self._proposal, self.cfg
        ack_us = self._ack_timeout_us(k.birth for k in p.members[1:])
        if now_us >= self._drop_due_us(p):
            # drop members that neither acknowledged nor spoke since this version began;
            # after a second timeout drop every non-acknowledging member
            final = now_us >= p.version_us + 2 * ack_us
            quiet_since = now_us + 1 if final else p.version_us
            drop = {k.birth for k in p.members[1:] if k.birth not in p.acked
                    and self._last_heard.get(k.birth, -1) < quiet_since}
            if drop:
                p.members = [k for k in p.members if k.birth not in drop]
                p.change += 1
                p.acked = set()
                p.version_us = now_us
                p.drop_check_us = now_us + self._ack_timeout_us(k.birth for k in p.members[1:])
                self._send_proposal(now_us)
                self._check_phase1(now_us)
                return
            p.drop_check_us = p.version_us + 2 * ack_us
        if now_us >= p.sent_us + c.retransmit_us:
            self._send_proposal(now_us)

    def _on_propose_primary(self, msg: Message, now_us: int) -> None:
        if self.status is Status.JOINING:
            return
        body = msg.body
        members = _decode_members(body["members"])
        proposer = Key(msg.precedence, msg.sender)
        if members[0] != proposer:
            raise RemoteProtocolError("proposal does not put its proposer first")
        target = body["old_pvn"] + 1
        # The paper's rules judge proposals that replace our own view (or, for a view we
        # hold by a proposal, that replace the same parent view). A proposal from another
        # branch of a partition is not for us: that branch is pruned, or prunes us, by
        # the precedence of its primary once it forms (`_competing_primary`).
        parent = (body["old_pvn"], body["old_primary"])
        if self._generated_target is not None and target < self._generated_target:
            return      # we denounced that view ourselves: its proposals are stale to us
        if target == self.pvn + 1:
            ours = parent == (self.pvn, self.primary.birth)
            if ours and not any(k.birth == proposer.birth for k in self.members):
                # a member our view's primary removed since (a committed change): its
                # proposal comes from a membership the group left, and its state lacks
                # what was served since. Beyond the paper: neither reset by it (line 25)
                # nor follow it; the primary tells it its membership, and an evidenced
                # proposer that learns it went on without it resets (`_on_membership`).
                self._resend_membership(now_us)
                return
        elif target == self.pvn:
            ours = parent == self._view_parent
        else:
            # a proposal replacing the view we are proposing ourselves ("or a
            # subsequent view" of the paper): we were denounced in turn
            p = self._proposal
            ours = p is not None and parent == (p.target, self.birth)
        if not ours:
            return
        prev = self._seen_pp.get(target)
        lo, hi = prev if prev else (proposer, proposer)
        self._seen_pp[target] = (min(lo, proposer), max(hi, proposer))
        if len(self._seen_pp) > MAX_TRACKED_VIEWS:          # far-future views go first
            del self._seen_pp[max(self._seen_pp)]
        included = any(k.birth == self.birth for k in members)
        acked = self._acked_pp.get(target)
        decision = decide_propose_primary(
            target=target, my_pvn=self.pvn, my_key=self.key, proposer=proposer,
            included=included, generated_target=self._generated_target,
            acked=acked[0] if acked else None,
            seen_max=prev[1] if prev else None,
            accepted_by_proposal=self._accepted_by_proposal)
        if decision is PPDecision.RESET:
            if (self.status in PRIMARY_STATUSES and not body["evidenced"]
                    and self.served_of()):
                # Beyond the paper: a proposer that knew no remote group took no remote
                # word, so nothing says we were silent to the groups we serve -- it was
                # cut off (alone, here) before our connections reached it, and its state
                # lacks what we served since. Reset by it, the group went on from that
                # state and the clients' replies were rolled back
                # (replica_unevidenced_proposal_excludes_a_serving_primary). We stay; if
                # it forms its view anyway, unserved, the competing-primary rule prunes
                # it and every member that followed it (a served branch outranks one
                # that is not).
                self.unevidenced_exclusions += 1
                return
            self._reset(now_us, f"excluded by ProposePrimary of {proposer} for view {target}")
        elif decision is PPDecision.ACCEPT:
            if self.status is Status.AWAITING_STATE:
                self._reset(now_us, "new primary proposed before our state arrived")
                return
            if acked and acked[0] == proposer and acked[1] > body["change"]:
                return                                   # an older version of that proposal
            if not (acked and acked[0] == proposer and acked[1] == body["change"]):
                self.status = Status.BACKUP
                self._proposal = self._pending = self._outgoing = None
                self._joiners.clear()
                self._needs_state = []
                self._acked_pp[target] = (proposer, body["change"])
                self._accepted_by_proposal = True
                self._view_parent = parent
                self._install(target, body["change"], members, body["max_precedence"], now_us,
                              f"{short_id(proposer.birth)} proposed itself as primary, "
                              f"replacing {short_id(parent[1])} of view {parent[0]}")
                self._last_heard[proposer.birth] = now_us
            # our max_precedence may exceed the proposer's (it was cut off while the old
            # primary admitted someone): the new primary continues above both
            self._send(MsgType.PROPOSE_PRIMARY_ACK, {"proposer": proposer.birth,
                                                     "change": body["change"],
                                                     "max_precedence": self.max_precedence})

    def _on_pp_ack(self, msg: Message, now_us: int) -> None:
        p = self._proposal
        if (self.status is Status.PROPOSING and msg.body["proposer"] == self.birth
                and msg.body["change"] == p.change
                and any(k.birth == msg.sender for k in p.members)):
            p.acked.add(msg.sender)
            self.max_precedence = max(self.max_precedence, msg.body["max_precedence"])
            self._check_phase1(now_us)

    def _check_phase1(self, now_us: int) -> None:
        p = self._proposal
        if {k.birth for k in p.members[1:]} <= p.acked:
            self._complete_phase1(now_us)

    def _complete_phase1(self, now_us: int) -> None:
        """Lines 14-16: every proposed member acknowledged; phase 2 is messaging's."""
        p = self._proposal
        self._proposal = None
        self._view_parent = p.parent
        self.status = Status.PRIMARY_PHASE2
        self._accepted_by_proposal = False
        self._install(p.target, p.change, p.members, self.max_precedence, now_us,
                      f"took over: {p.why}; every member acknowledged")
        for k in p.members:
            self._last_heard[k.birth] = now_us
        self._heartbeat_sent(now_us - self.cfg.heartbeat_interval_us)   # announce at once
        self._emit(ViewEntered(self.birth, self.pvn, self.birth))
        self._emit(BeginPhase2(self.pvn, tuple(self.members)))

    # ---- backups: membership messages (backup-change lines 15-21, 43-46) ---------------

    def _on_membership(self, msg: Message, now_us: int) -> None:
        body = msg.body
        members = _decode_members(body["members"])
        if members[0] != Key(msg.precedence, msg.sender):
            raise RemoteProtocolError("membership does not put its primary first")
        included = any(k.birth == self.birth for k in members)
        ack = (MsgType.ACCEPT_BACKUP_ACK if msg.type is MsgType.ACCEPT_BACKUP
               else MsgType.REMOVE_BACKUP_ACK)
        if self.status is Status.JOINING:
            if included:
                self.status = Status.AWAITING_STATE
                self._incoming = None
                self.lineage = body["lineage"]
                self._heartbeat_sent(now_us)
                self._install(msg.pvn, body["change"], members, body["max_precedence"], now_us,
                              f"admitted as a backup by primary {short_id(msg.sender)}")
                self._last_heard[msg.sender] = now_us
                self._emit(ViewEntered(self.birth, self.pvn, msg.sender))
                self._send(ack, {"change": body["change"]})
            return
        if self.status in PRIMARY_STATUSES:
            return
        if msg.sender != self.primary.birth or msg.pvn != self.pvn:
            return
        if self.status is Status.PROPOSING:
            # the primary we are replacing committed a change we never got: one that
            # removed us (the group left us: a member no more cannot take it over), or
            # one that kept us (our ProposePrimary still resets it: we go on, without
            # dropping members meanwhile: `_on_heartbeat`)
            if body["change"] > self.change:
                if not included:
                    self._reset(now_us, f"primary {short_id(msg.sender)} of view {self.pvn} "
                                        f"went on at change {body['change']} without us "
                                        f"while we proposed")
                elif self._proposal.evidenced:
                    self._proposal.primary_went_on_us = now_us
            return
        if body["change"] <= self.change:
            if included:
                self._send(ack, {"change": body["change"]})      # our ack was lost
            return
        if not included:
            self._reset(now_us, f"removed from the membership (change {body['change']})")
            return
        self._install(self.pvn, body["change"], members, body["max_precedence"], now_us,
                      "the primary " + describe_change(self.members, members))
        self._send(ack, {"change": body["change"]})

    def _on_state(self, msg: Message, now_us: int) -> None:
        body = msg.body
        if (body["to"] != self.birth or self.primary is None
                or msg.sender != self.primary.birth):
            return
        chunks, chunk = body["chunks"], body["chunk"]
        if not 0 <= chunk < chunks <= MAX_STATE_CHUNKS:
            raise RemoteProtocolError("state chunk out of range")
        if self.status is Status.AWAITING_STATE:
            inc = self._incoming
            if inc is None or inc.chunks != chunks:
                inc = self._incoming = _Incoming(chunks)
            inc.parts[chunk] = body["data"]
            if len(inc.parts) == chunks:
                data = b"".join(inc.parts[i] for i in range(chunks))
                self._incoming = None
                self.state.restore(data)
                self.status = Status.BACKUP
                self._emit(StateRestored(len(data)))
        if self.status in (Status.AWAITING_STATE, Status.BACKUP):
            self._send(MsgType.STATE_ACK, {"chunk": chunk})

    def _on_heartbeat(self, msg: Message, now_us: int) -> None:
        if (self.status is Status.PROPOSING and self._proposal.evidenced
                and msg.sender == self.members[0].birth
                and msg.pvn == self.pvn and msg.body.get("change", 0) > self.change):
            # The primary we are replacing speaks in its view at a membership change we
            # never got: it went on after our evidence was taken, and the remote groups,
            # still in its view, may hear it again. Our proposal must not complete by
            # dropping the members that do not answer (`_proposal_tick`): alone, our
            # stale state would become the group's and roll back what it served since
            # (a proposer paused through the heal did that:
            # replica_paused_backup_acts_on_stale_evidence). We wait for the word that
            # decides: its membership, if that change removed us (`_on_membership`:
            # reset), or its reset by our ProposePrimary (the paper's line 25), after
            # which it falls silent. Resetting ourselves at once instead lost the group
            # when our ProposePrimary, already on its way, reset the primary too.
            self._proposal.primary_went_on_us = now_us
            return
        # liveness was noted in _note_sender; a senior backup's detector wait is ours too
        if msg.pvn == self.pvn and self.status is Status.BACKUP:
            if 2 <= self._rank_of(msg.sender) < self.rank:
                self._senior_wait_us[msg.sender] = 1000 * msg.body["wait"]
        # the primary tells a replica that believes it is a member of this view, but is
        # not, its current membership
        if (msg.pvn == self.pvn and msg.precedence > 0
                and not any(k.birth == msg.sender for k in self.members)):
            self._resend_membership(now_us)

    def _resend_membership(self, now_us: int) -> None:
        """As the primary, tell a replica that believes it is a member of this view, but
        is not, our current membership (once per retransmit interval)."""
        if (self.status is Status.PRIMARY
                and now_us >= self._resent_membership_us + self.cfg.retransmit_us):
            self._resent_membership_us = now_us
            mtype = self._pending.mtype if self._pending else MsgType.REMOVE_BACKUP
            self._send(mtype, self._membership_body(self.change, self.members,
                                                    self.members))

    # ---- primary: changes of a backup (backup-change lines 23-42) ----------------------

    def _on_propose_backup(self, msg: Message, now_us: int) -> None:
        if self.status not in PRIMARY_STATUSES:
            return
        b = msg.sender
        if any(k.birth == b for k in self.members) or b in self._joiners:
            return
        refusal = getattr(self.state, "join_refusal", None)
        why = refusal() if refusal is not None else None
        if why is not None:
            # no state to give it: tell it why, so that it stops with one clear line
            # instead of applying for ever (it applies every join_retry_us: one answer each)
            self._send(MsgType.REFUSE_BACKUP, {"to": b, "why": why})
            return
        if len(self.members) + len(self._joiners) < MAX_MEMBERS:
            self._joiners.append(b)
        if self.status is Status.PRIMARY:
            self._primary_tick(now_us)

    def _membership_body(self, change: int, members: list[Key], old: list[Key]) -> dict:
        return {"members": _encode_members(members), "old_members": _encode_members(old),
                "change": change, "max_precedence": self.max_precedence,
                "lineage": self.lineage}

    def _begin_change(self, mtype: MsgType, members: list[Key], now_us: int,
                      why: str = "") -> None:
        old = self.members
        self._install(self.pvn, self.change + 1, members, self.max_precedence, now_us,
                      describe_change(old, members) + (f" ({why})" if why else ""))
        self._pending = _Change(mtype, self.change, list(members), list(old), now_us)
        for k in members:
            self._last_heard.setdefault(k.birth, now_us)
        self._send_change(now_us)
        self._check_commit(now_us)

    def _send_change(self, now_us: int) -> None:
        ch = self._pending
        self._send(ch.mtype, self._membership_body(ch.change, ch.members, ch.old_members))
        ch.sent_us = now_us

    def _on_change_ack(self, msg: Message, now_us: int) -> None:
        ch = self._pending
        if (self.status in PRIMARY_STATUSES and ch is not None
                and msg.body["change"] == ch.change and msg.pvn == self.pvn):
            ch.acked.add(msg.sender)
            self._check_commit(now_us)

    def _check_commit(self, now_us: int) -> None:
        ch = self._pending
        if {k.birth for k in ch.members[1:]} <= ch.acked:
            self._pending = None                          # line 39: committed
            self._primary_tick(now_us)

    def _backup_timeout_us(self, birth: int) -> int:
        c = self.cfg
        return c.backup_timeout_us + self._extension_us(birth, c.backup_timeout_us)

    def _silent_backups(self, now_us: int) -> set[int]:
        return {k.birth for k in self.members[1:]
                if self._last_heard.get(k.birth, now_us) + self._backup_timeout_us(k.birth)
                < now_us}

    def _unacked_late(self, ch: _Change, now_us: int) -> set[int]:
        """Members that did not acknowledge `ch` within their ack timeout."""
        return {k.birth for k in ch.members[1:] if k.birth not in ch.acked
                and now_us >= ch.started_us + self._ack_timeout_us([k.birth])}

    def _primary_deadlines(self) -> list[int]:
        """The primary's deadlines but its backups' silence (`deadlines`)."""
        c, t = self.cfg, []
        if self._pending is not None:
            ch = self._pending
            t.append(ch.sent_us + c.retransmit_us)
            t.extend(ch.started_us + self._ack_timeout_us([k.birth])
                     for k in ch.members[1:] if k.birth not in ch.acked)
        if (self._outgoing is not None and self._pending is None
                and self.status is Status.PRIMARY):
            t.append(self._outgoing.sent_us + c.retransmit_us)
        return t

    def _primary_tick(self, now_us: int) -> None:
        c = self.cfg
        silent = self._silent_backups(now_us)
        left = {k.birth for k in self.members[1:] if k.birth in self._backups_left}
        why = [short_id(b) + " silent for "
               + f"{(now_us - self._last_heard.get(b, now_us)) // 1000} ms"
               for b in silent - left]
        why += [short_id(b) + " left (it said so as it stopped)" for b in left]
        silent |= left
        ch = self._pending
        if ch is not None:
            late = self._unacked_late(ch, now_us) - silent
            why += [short_id(b) + f" did not acknowledge change {ch.change} in "
                    f"{(now_us - ch.started_us) // 1000} ms" for b in late]
            silent |= late
            if silent:
                self._remove(silent, now_us, why)         # supersedes the pending change
            elif now_us >= ch.sent_us + c.retransmit_us:
                self._send_change(now_us)
        elif silent:
            self._remove(silent, now_us, why)
        elif self._joiners and self.status is Status.PRIMARY:
            self._admit(now_us)
        if self._pending is None and self.status is Status.PRIMARY:
            self._transfer_tick(now_us)

    def _remove(self, births: set[int], now_us: int, why: list[str]) -> None:
        """Lines 28-34: the primary drops silent / non-acknowledging backups."""
        self._needs_state = [b for b in self._needs_state if b not in births]
        for b in births:
            self._settling.pop(b, None)
            self._restoring_us.pop(b, None)
        if self._outgoing is not None and self._outgoing.to in births:
            self._outgoing = None
        self._begin_change(MsgType.REMOVE_BACKUP,
                           [k for k in self.members if k.birth not in births], now_us,
                           "; ".join(sorted(why)))

    def _admit(self, now_us: int) -> None:
        """Line 23: the next precedences, above every precedence ever assigned."""
        members = list(self.members)
        while self._joiners and len(members) < MAX_MEMBERS:
            self.max_precedence += 1
            b = self._joiners.popleft()
            members.append(Key(self.max_precedence, b))
            self._needs_state.append(b)
        self._begin_change(MsgType.ACCEPT_BACKUP, members, now_us)

    def _transfer_tick(self, now_us: int) -> None:
        """Lines 39-42: checkpoint at commit, State chunks with acks and retransmission."""
        if self._outgoing is None and self._needs_state:
            to = self._needs_state.pop(0)
            data = self.state.checkpoint()
            if data is None:            # the provider has no whole state (docs/LOG.md)
                self._remove({to}, now_us, [short_id(to) + ": no state to give it, the group's log is full"])
                return
            size = self.cfg.state_chunk_bytes
            chunks = [data[i:i + size] for i in range(0, len(data), size)] or [b""]
            if len(chunks) > MAX_STATE_CHUNKS:
                raise RuntimeError(f"checkpoint of {len(data)} bytes exceeds MAX_STATE_CHUNKS")
            self._outgoing = _Outgoing(to, chunks, sent_us=-(1 << 62))
            mib = len(data) / (1 << 20)
            if mib > 1:     # the joiner restores as its last chunk arrives, before it acks
                self._restoring_us[to] = int((mib - 1) * self.cfg.restore_allowance_us_per_mib)
        out = self._outgoing
        if out is not None and now_us >= out.sent_us + self.cfg.retransmit_us:
            self._send_window(now_us)

    def _send_chunk(self, i: int) -> None:
        out = self._outgoing
        self._send(MsgType.STATE, {"to": out.to, "chunk": i, "chunks": len(out.chunks),
                                   "data": out.chunks[i]})

    def _send_window(self, now_us: int) -> None:
        """Retransmit every unacknowledged chunk sent so far (at most a window of
        them), then open the window with new chunks."""
        out = self._outgoing
        for i in range(out.next_new):
            if i not in out.acked:
                self._send_chunk(i)
        self._fill_window()
        out.sent_us = now_us

    def _fill_window(self) -> None:
        out = self._outgoing
        while (out.next_new < len(out.chunks)
               and out.next_new - len(out.acked) < self.cfg.state_window_chunks):
            self._send_chunk(out.next_new)
            out.next_new += 1

    def _on_state_ack(self, msg: Message, now_us: int) -> None:
        out = self._outgoing
        if self.status is not Status.PRIMARY or out is None or msg.sender != out.to:
            return
        chunk = msg.body["chunk"]
        if not 0 <= chunk < out.next_new or chunk in out.acked:
            return
        out.acked.add(chunk)
        if len(out.acked) == len(out.chunks):
            self._outgoing = None
            self._settling[out.to] = SETTLING_HEARTBEATS
            self._transfer_tick(now_us)
        else:
            self._fill_window()

    def leave(self, now_us: int) -> bool:
        """We stop for good (our runtime's SIGTERM). The primary, once its backups hold
        its order info: LEAVE tells them, and the senior one takes over as soon as the
        remote groups confirm (one PROBE round trip) rather than after its detector. A
        backup: the primary removes it at once rather than after its timeout on it (up to
        floor + cap, 500 ms under `llft run`, for one still replaying), during which an
        external send would wait for it. Sent twice (a lost one costs only that
        timeout). True if sent."""
        if not ((self.status is Status.PRIMARY and len(self.members) >= 2)
                or (self.status is Status.BACKUP and self.rank >= 2)):
            return False
        for _ in range(2):
            self._send(MsgType.LEAVE, {})
        return True

    def _on_leave(self, msg: Message, now_us: int) -> None:
        if (self.status in PRIMARY_STATUSES and msg.pvn == self.pvn
                and self._rank_of(msg.sender) >= 2):
            self._backups_left.add(msg.sender)      # removed at our next tick: now
            if self.status is Status.PRIMARY:
                self._primary_tick(now_us)
            return
        if (self.status is not Status.BACKUP or msg.pvn != self.pvn or not self.members
                or msg.sender != self.primary.birth or self._left()):
            return
        self._primary_left, self._left_at_us = (self.pvn, msg.sender), now_us
        if self.rank == 2:
            # its detector fires now; the evidence is asked for as after any silence (the
            # remote groups heard the primary last before its LEAVE); the other backups
            # follow its proposal as usual
            self._fault_detector_fired(now_us)

    def _on_refuse_backup(self, msg: Message, now_us: int) -> None:
        if (self.status is Status.JOINING and msg.body["to"] == self.birth
                and msg.precedence > 0 and not self.join_refused):
            self.join_refused = True
            self._emit(JoinRefused(msg.sender, msg.body["why"]))

    _HANDLERS = {
        MsgType.HEARTBEAT: _on_heartbeat,
        MsgType.REFUSE_BACKUP: _on_refuse_backup,
        MsgType.LEAVE: _on_leave,
        MsgType.PROPOSE_PRIMARY: _on_propose_primary,
        MsgType.PROPOSE_PRIMARY_ACK: _on_pp_ack,
        MsgType.PROPOSE_BACKUP: _on_propose_backup,
        MsgType.ACCEPT_BACKUP: _on_membership,
        MsgType.REMOVE_BACKUP: _on_membership,
        MsgType.ACCEPT_BACKUP_ACK: _on_change_ack,
        MsgType.REMOVE_BACKUP_ACK: _on_change_ack,
        MsgType.STATE: _on_state,
        MsgType.STATE_ACK: _on_state_ack,
    }
