"""One replica of a group: the membership core and the messaging core, composed, sans-IO.

Theory of operation
-------------------
A `ReplicaNode` owns one `membership.core.Membership` and one
`llft.protocol.messaging.MessagingEndpoint` and follows the same sans-IO convention
(docs/ARCHITECTURE.md): `handle_message`, `handle_timer`, `next_timer_us`,
`take_actions`. The simulator kernel and the asyncio `Driver` therefore run whole
replicas. After every event the node *settles*: it drains both cores' actions, turns
each one into calls on the other core or into its own actions, and repeats until both
are quiet (at most `MAX_SETTLE_ROUNDS`).

Routing of received messages:

    membership types (PROPOSE_*, ACCEPT_*, REMOVE_*, STATE*)    -> membership
    HEARTBEAT                                                   -> membership; and
                                         messaging, if it is messaging's own (ts > 0)
    everything else (data, acks, NACK, ORDER_INFO, NEW_PRIMARY_VIEW*) -> messaging

Membership's heartbeats carry ts = back = ack = 0; messaging's always carry a Lamport
ts > 0. A primary's messaging reads `back`/`ack` of every backup HEARTBEAT as that
backup's watermark report, so a membership heartbeat given to it would zero the report
and pin the group watermark until the next messaging heartbeat: the node keeps them
apart (messaging itself should ignore ts == 0). (Merging the two -- membership's
heartbeat stamped with messaging's fields -- was tried on branch `quiet` and made
`llft simulate replica` find a client keeping output of a history the server group did
not keep, seed 1487089079767897775 of tests/sim/test_replica.py::test_campaign; not
understood yet.) What is merged instead is only the sending: a receiver's membership
reads of a HEARTBEAT its header (pvn, precedence, sender) and `rank`, which messaging's
heartbeat carries too, so every messaging HEARTBEAT this node sends is shown to
membership (`Membership.heartbeat_carried`); when its header is what membership's own
would say, membership sends none for the next 1.5 intervals. While messaging is live
and has a peer (it heartbeats every interval) an idle member thus sends one heartbeat
per interval instead of two; membership's own goes on where messaging's does not (a
primary alone, a joiner, a member awaiting state, a view messaging has not reached).
Messaging's heartbeat is a `Pulse` (messages.py): the driver repeats it every interval
until the next refresh, and while a member is quiet the refresh comes every
`pulse_intervals` intervals with the same message; membership's tick waits for those
refreshes too (its gaps are how it tells a local stall). Receivers absorb the repeated
copies without waking their loop and hand them in before the next event
(`heard_again`): the copies say their sender lived; the last is handled as any message.

Messaging is *live* only while this replica is a member holding the group's state: a
founder from its BeginPhase2, a joiner from its StateRestored. Before that it gets no
message and no view (the primary's watermark waits for the joiner's reports meanwhile,
so nothing the joiner will need is collected).

Wiring (membership action -> what the node does):

    MembershipChanged  messaging.set_view(pvn, members[0], members, me)   (if live)
    BeginPhase2        messaging.set_view(...): NEW_PRIMARY_VIEW on every connection;
                       messaging's Phase2Done(pvn) -> membership.phase2_complete(pvn).
                       A founder (messaging had no view, no connection) completes at once.
    ViewStarted        messaging.add_order_info(view marker of pvn): the first order-info
                       entry of the view; a backup that delivers it calls
                       membership.view_entered(pvn) and emits ViewSwitch
    StateRestored      the checkpoint is applied (below), messaging goes live, Restored
    Reset              a fresh MessagingEndpoint under the new birth id, logs dropped,
                       RestartApp (the runtime kills and restarts the application)

Order-info chunks are framed by the node: one tag byte, then the payload.
    0x00 + app chunk           the determinizer's (opaque here)
    0x01 + pvn + prev pvn + prev end (8 bytes each, BE)
                               the view marker (VIEW_MARKER_TAG): the view before ends at
                               (prev pvn, prev end) in this primary's history
    0x02 + pvn + pos + entry   catch-up (CATCH_UP_TAG): entry `pos` of earlier view `pvn`

Catch-up. When a primary fails, its backups may hold different prefixes of its order
info (its last entries reached some and not others; phase 2 may have recovered more from
a remote group, `RecoveredOrderInfo`). Before its view marker, a new primary re-sends,
as catch-up entries of the new view, the old view's entries from the lowest position a
backup was seen to acknowledge (`MessagingEndpoint.peer_order_info_acks`) to the end of
its own history. A backup delivers each inner entry it does not hold, in place, then
the marker; a backup that holds *more* of the old view than the marker says the new
primary has executed order info the group's history will not contain: it rejoins
(`Membership.abandon`). The log keeps entries as delivered (tagged), so a catch-up is
kept once as itself and once as the entry it carries if that was new here.

Actions: the node emits exactly the vocabulary of llft/replica/actions.py (its own
actions, the cores' sends, and the core actions it passes through for status); the
runtime reads the replica only through the public API block of `ReplicaNode`.

Application side. `open`, `send`, `send_space` pass through to messaging: at the
primary `send` transmits, at a backup it logs (semi-active). `add_order_info` is the
primary's, and only once its view started (PRIMARY status): in phase 2 it raises
`NotReady` (the view marker must come first). Deliveries reach the application as
`Deliver(conn, offset, data)`, exactly once and in offset order per connection;
order info as `OrderInfo(pvn, pos, chunk)`, including, at a new primary, the old
primary's entries that phase 2 recovered beyond what this replica had delivered
(`RecoveredOrderInfo`, logged like any other: later joiners replay them).

State (StateProvider, at the primary when an addition commits). The checkpoint is the
group's log: every byte this node delivered on each connection since the start, every
order-info entry since the start (as (pvn, pos, chunk)), a snapshot of each messaging
connection (remote view and msn delivered up to, stream offsets, the unacknowledged tail
of our own stream, which a backup would hold in its log) and the application's own part
(`AppState`, filled by the determinizer later; empty by default). A joining backup
restores the connections into its messaging endpoint, swallows the first `out_offset`
bytes its replaying application writes on each connection (the group already sent
them), and emits `Restored(streams, order_info, app_state)`: the application replays
those inputs, then continues with ordinary deliveries.

Order info before the state. A joiner counts among the primary's backups from its
admission; until its state arrives it has no messaging to acknowledge order info with,
and the primary's output commit (docs/DESIGN.md, "Output commit") held every reply for
the whole transfer. Meanwhile it keeps the order info of its view that its primary sends
the backups (ORDER_INFO), at most MAX_EARLY_OI_*, and answers each with JOINER_OI_ACK
(from, upto): the run it holds without a hole from its lowest position. The checkpoint
is taken after the admission and holds every position up to where the joiner joined, so
a run from at or below the next one means that once restored it holds all up to `upto`
(the primary checks `from`, messaging `_on_joiner_oi_ack`); before that it cannot take
over. Restored, it delivers the run past its checkpoint (`_apply_restore`), and
`Restored.log_upto` says where the state ended.

The log's cap (docs/LOG.md). The log grows with the group's history (joiners replay it
all) up to `log_cap_bytes` (delivered inputs + order-info bytes) or `log_cap_entries`
order-info entries. Reaching either is a state, not a crash: the node drops the log
(`log_full` says why; the runtime logs it once), keeps only stream offsets, and from
then on admits no new backup (`join_refusal` says why: membership answers each
application with it, and the applicant's runtime stops with that line; a joiner admitted
before gets no checkpoint and is removed). The group runs on with the members it has.

Backup lag (docs/LOG.md). A backup's runtime tells the node how far its application has
executed (`set_executed`); messaging reports it to the primary on ORDER_INFO acks. At the
primary `lag_hold(now)` says whether a *ready* backup (one that has caught up once:
it executed a position made after it joined, so a joiner, or a backup a new primary
inherits, is not held for while it replays the history) is more than `lag_bound_us` of
the primary's execution behind: the runtime then holds ordering and output commit
(backpressure). A ready backup above the bound for `lag_give_up_us` is *released*: no
longer ready, so no longer held for, until it has been back within the bound for
`lag_give_up_us` in a row (hysteresis: a backup that keeps falling behind on a busy
machine would otherwise stall the group again and again); the runtime logs the release
(`last_lag_release`). A replica that cannot keep up must not stall the group for
ever, and a busy machine is not a dead peer: it is not removed (a reset would make it
replay the whole history, loading the machine more); a takeover by it may then replay
more than the bound.

Bounds: MAX_SETTLE_ROUNDS, the log's cap (above), MAX_HELD_ACTIONS. No clock, no I/O, no
global randomness here.
"""
from __future__ import annotations

import random
from collections import deque
from typing import Any, Callable, Protocol

import msgpack

from llft.protocol import messaging as mg
from llft.protocol.messages import MEMBERSHIP_CORE_TYPES, Message, MsgType, Pulse, Role
from llft.replica.actions import (ACTION_TYPES, Deliver, NodeAction, OrderInfo, RestartApp,
                                  Restored, ViewSwitch)
from membership import core as mb

MAX_SETTLE_ROUNDS = 64           # cores feeding each other longer than this is a bug
LOG_CAP_BYTES = 256 << 20        # the group's log (inputs + order info) kept for joiners
LOG_CAP_ENTRIES = 1 << 20        # order-info entries in it
LAG_BOUND_US = 1_000_000         # a ready backup at most ~1 s of execution behind
LAG_GIVE_UP_US = 10_000_000      # ... or it is released after this long above the bound
MAX_HELD_ACTIONS = 65_536        # node actions not yet taken by the runtime
# order info a joiner keeps while its state is on its way ("Order info before the state")
MAX_EARLY_OI_POSITIONS = 16_384
MAX_EARLY_OI_BYTES = 16 << 20

APP_TAG = 0x00
VIEW_MARKER_TAG = 0x01
CATCH_UP_TAG = 0x02
CHECKPOINT_VERSION = 3          # 3: the log holds entries as delivered (tagged)


class NotReady(Exception):
    """The call does not fit this replica's role now (order info from a backup, or from
    a primary whose view has not started)."""


class AppState(Protocol):
    """The application's part of a checkpoint (the determinizer provides it)."""

    def checkpoint(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class _NoAppState:
    def checkpoint(self) -> bytes:
        return b""

    def restore(self, data: bytes) -> None:
        pass


def encode_view_marker(pvn: int, prev: tuple[int, int] = (0, 0)) -> bytes:
    """The first entry of view `pvn`; `prev` = (pvn, last position) of the view before
    as the new primary ends it (0, 0 for a founder)."""
    return (bytes([VIEW_MARKER_TAG]) + pvn.to_bytes(8, "big") + prev[0].to_bytes(8, "big")
            + prev[1].to_bytes(8, "big"))


def decode_view_marker(entry: bytes) -> tuple[int, int, int] | None:
    """(pvn, previous view, its last position) of a view marker, None if not one."""
    if entry[:1] != bytes([VIEW_MARKER_TAG]) or len(entry) != 25:
        return None
    return (int.from_bytes(entry[1:9], "big"), int.from_bytes(entry[9:17], "big"),
            int.from_bytes(entry[17:], "big"))


CATCH_UP_HEADER = 17            # tag + pvn + pos


def encode_catch_up(pvn: int, pos: int, entry: bytes) -> bytes:
    """An entry of an earlier view (`pvn`, `pos`, as delivered there, tagged) re-sent by a
    new primary to its backups."""
    return bytes([CATCH_UP_TAG]) + pvn.to_bytes(8, "big") + pos.to_bytes(8, "big") + entry


def decode_catch_up(entry: bytes) -> tuple[int, int, bytes] | None:
    """(pvn, pos, entry) a catch-up carries, None if not one."""
    if entry[:1] != bytes([CATCH_UP_TAG]) or len(entry) <= CATCH_UP_HEADER:
        return None
    return (int.from_bytes(entry[1:9], "big"), int.from_bytes(entry[9:17], "big"),
            entry[CATCH_UP_HEADER:])


class ReplicaNode:
    """One replica: membership + messaging (see the module docstring)."""

    def __init__(self, group: str, rng: random.Random, *,
                 membership_config: mb.Config | None = None,
                 messaging_config: mg.MessagingConfig | None = None,
                 app_state: AppState | None = None,
                 log_cap_bytes: int = LOG_CAP_BYTES, log_cap_entries: int = LOG_CAP_ENTRIES,
                 lag_bound_us: int = LAG_BOUND_US, lag_give_up_us: int = LAG_GIVE_UP_US,
                 wrap_messaging: Callable[[mg.MessagingEndpoint], Any] | None = None):
        """`wrap_messaging`: what runs each messaging core the node makes, given the core
        (a `LanedEndpoint` lending steady events to a lane; None: the core itself)."""
        self.group = group
        self.wrap_messaging = wrap_messaging
        self.log_cap_bytes, self.log_cap_entries = log_cap_bytes, log_cap_entries
        self.lag_bound_us, self.lag_give_up_us = lag_bound_us, lag_give_up_us
        self.messaging_config = messaging_config or mg.MessagingConfig()
        self.app_state = app_state or _NoAppState()
        self.membership = mb.Membership(membership_config or mb.Config(group=group), rng,
                                        self)
        self.membership.remote_groups_of = self._remote_groups
        self.membership.served_of = lambda: self.live and self.messaging.served
        self._served_said = False           # `served` when last checked (`_settle`)
        self.stats: dict[str, int] = {}
        self._mb_next: tuple | None = None  # membership's deadlines, cached (`_membership_next`)
        self._actions: deque[NodeAction] = deque()
        self._now = 0
        self._fresh_messaging()

    def _remote_groups(self) -> list[str]:
        """The groups this replica has open connections with (membership asks when its
        detector fires: a takeover then needs to hear one of them)."""
        return sorted({cid[0] for cid in self.messaging.conns} - {self.group})

    def _fresh_messaging(self) -> None:
        self.messaging = mg.MessagingEndpoint(self.group, self.membership.birth,
                                              self.messaging_config)
        self.messaging.wait_of = self.membership.detector_wait_ms   # said in its HEARTBEATs
        self.messaging.replay_of = self.membership.replay_flag
        self.messaging.rm_of = self.membership.removal_wait_ms
        self.messaging.probe_state_of = \
            lambda since_us: self.membership.probe_state(self._now, since_us)
        if self.wrap_messaging is not None:
            self.messaging = self.wrap_messaging(self.messaging)
        self.live = False                       # messaging fed (member holding state)
        self._leaving = False                   # abandoned: the endpoint's rest is dropped
        self._gone = False                      # left the group for good (`leave`)
        self.started_pvn = 0                    # primary view whose marker we logged
        self.streams: dict[mg.ConnId, bytearray] = {}
        self.stream_base: dict[mg.ConnId, int] = {}   # bytes dropped (the log was full)
        self.input_bytes = 0
        self.oi_log_bytes = 0
        self.log_full: str | None = None        # why the log was dropped (docs/LOG.md)
        self._ready: set[int] = set()           # primary: backups that caught up once
        self._over_since: dict[int, int] = {}   # primary: ready backup -> above bound since
        self._released: dict[int, int | None] = {}   # released backup -> within bound since
        self.last_lag_release: tuple[int, str] | None = None   # (backup, why): for the log
        self.lag_held_for: tuple[int, ...] = ()  # primary: the backups the last hold was for
        # (pvn, pos, entry as delivered: tagged, see "Order-info chunks")
        self.order_info_log: deque[tuple[int, int, bytes]] = deque()
        self.oi_upto: dict[int, int] = {}       # pvn -> highest position in the log
        self.skip_out: dict[mg.ConnId, int] = {}
        self.ends: dict[mg.ConnId, bool] = {}   # remote streams that ended (abort?)
        self._restore_blob: bytes | None = None
        # a joiner awaiting its state: the primary's order info of view `_early_pvn`
        self._early_oi: dict[int, bytes] = {}
        self._early_pvn = 0
        self._early_bytes = 0

    # ==== public API of the runtime =========================================================
    # What an agent reads of its replica. It calls these, the sans-IO surface and the
    # application calls below, and never reaches into `membership` or `messaging`.
    @property
    def birth(self) -> int:
        return self.membership.birth

    @property
    def status(self) -> mb.Status:
        return self.membership.status

    @property
    def pvn(self) -> int:
        return self.membership.pvn

    @property
    def rank(self) -> int:
        return self.membership.rank

    @property
    def is_primary(self) -> bool:
        return self.membership.status in mb.PRIMARY_STATUSES

    def backups_hold_all_order_info(self) -> bool:
        """Every order-info entry this primary produced is acknowledged by every backup
        (nothing it would lose by leaving now)."""
        return self.messaging.order_info_held() == 0

    def order_info_delivered(self, pvn: int) -> int:
        """The highest order-info position of view `pvn` this replica holds (0: none)."""
        return self.oi_upto.get(pvn, 0)

    def hold_founding(self, why: str | None) -> None:
        """The runtime knows a live member it cannot hear: do not found (membership)."""
        self._touched().hold_founding(why)     # its deadlines change with it

    def set_catching_up(self, flag: bool) -> None:
        """The application replays the history we joined with: longest timeouts, ours on
        our peers and our primary's on us (membership; our HEARTBEATs say it from the
        next one on, not after the repetition of the last: `_heartbeat_news`)."""
        said = self.membership.replay_flag()
        self._touched().set_catching_up(flag)
        if self.membership.replay_flag() != said:
            self._heartbeat_news()

    def set_catch_up_estimate(self, us: int, now_us: int) -> None:
        """How long the application needs for what it was given: no takeover before
        that replay would end (membership)."""
        self.membership.set_catch_up_estimate(us, now_us)

    def join_refusal(self) -> str | None:
        """Membership asks before admitting a backup: only with the whole log (None),
        else why not, as the applicant's operator will read it."""
        if self.log_full is None:
            return None
        return (f"{self.log_full}: it was dropped and the group admits no new replica; "
                f"restart the whole group to add one (docs/LOG.md)")

    def set_executed(self, pvn: int, pos: int, now_us: int | None = None) -> None:
        """A backup: its application executed order info of view `pvn` up to `pos`."""
        if self.live and pvn == self.messaging.pvn and not self.messaging.is_primary:
            if now_us is not None:
                self._now = max(self._now, now_us)
            self.messaging.set_executed(pos, now_us)
            self._settle()

    def backup_lag(self, now_us: int) -> dict[int, dict]:
        """The primary: each backup's lag (entries = order-info positions its application
        has not executed, ms = age of the oldest of them, ready = caught up once,
        executed = positions of this view its application executed)."""
        if not self.live:
            return {}
        lags = self.messaging.backup_lag(now_us)
        made = self.messaging.order_info_produced() if lags else 0
        return {b: {"entries": n, "ms": round(age / 1000, 1), "ready": b in self._ready,
                    "executed": made - n}
                for b, (n, age, _) in lags.items()}

    def lag_hold(self, now_us: int) -> bool:
        """The primary: True while a ready backup is more than lag_bound_us behind (the
        runtime holds its application: backpressure on ordering); a ready backup above the bound for
        lag_give_up_us is released: not held for until it has been back within the
        bound for lag_give_up_us."""
        self._now = max(self._now, now_us)
        lags = self.messaging.backup_lag(now_us) if self.live else {}
        for gone in (self._ready | set(self._over_since) | set(self._released)) - set(lags):
            self._ready.discard(gone)
            self._over_since.pop(gone, None)
            self._released.pop(gone, None)
        held_for = []
        bound = self.lag_bound_us
        for b, (_, age, caught_up) in lags.items():
            if b in self._released:
                if age > bound:
                    self._released[b] = None
                elif self._released[b] is None:
                    self._released[b] = now_us
                elif now_us - self._released[b] >= self.lag_give_up_us:
                    del self._released[b]
                    self._ready.add(b)
                continue
            if b not in self._ready:
                if caught_up and age <= bound:
                    self._ready.add(b)
                continue
            if age <= bound:
                self._over_since.pop(b, None)
                continue
            since = self._over_since.setdefault(b, now_us)
            if now_us - since < self.lag_give_up_us:
                held_for.append(b)
                continue
            self._count("lag_released")
            self._over_since.pop(b)
            self._ready.discard(b)
            self._released[b] = None
            self.last_lag_release = (b, f"its application stayed more than {bound / 1e6:g} s "
                                        f"behind for {self.lag_give_up_us / 1e6:g} s")
        # (the log names these: the backup furthest behind may be a joiner not held for)
        self.lag_held_for = tuple(held_for)
        return bool(held_for)

    def lag_quiet(self) -> bool:
        """The primary: no backup has entries to execute and none is being timed (over
        the bound, released): `lag_hold` has nothing to decide until entries move."""
        if self._over_since or self._released:
            return False
        lags = self.messaging.backup_lag(self._now) if self.live else {}
        return all(n == 0 and (b in self._ready or not caught_up)
                   for b, (n, _, caught_up) in lags.items())

    def status_snapshot(self) -> dict:
        """The replica as `llft status` shows it (the agent adds its own fields)."""
        m = self.membership
        members = [{"birth": k.birth, "precedence": k.precedence, "rank": i + 1}
                   for i, k in enumerate(m.members)]
        me = next((x for x in members if x["birth"] == self.birth), None)
        st = m.status
        role = ("primary" if st in mb.PRIMARY_STATUSES else
                "backup" if st is mb.Status.BACKUP else st.value)
        e = self.messaging
        return {
            "birth": self.birth, "role": role, "status": st.value,
            "rank": me["rank"] if me else None,
            "precedence": me["precedence"] if me else None,
            "pvn": m.pvn, "primary": m.members[0].birth if m.members else None,
            "members": members,
            # the detector fired; no remote group has said our primary is silent there too
            "takeover": {"held": m.takeover_held, "held_count": m.takeovers_held,
                         "primary_alive_answers": m.probes_alive},
            "order_info": {"produced": e.order_info_produced() if e.is_primary else None,
                           "delivered": self.order_info_delivered(m.pvn)},
            "backup_lag": {f"{b:x}": v for b, v in self.backup_lag(self._now).items()}
            if e.is_primary else {},
            # backups whose HEARTBEATs say they replay their history (longest timeouts)
            "backups_replaying": [f"{b:x}" for b in sorted(m.backups_replaying())],
            "log": {"input_bytes": self.input_bytes, "order_info_bytes": self.oi_log_bytes,
                    "entries": len(self.order_info_log), "cap_bytes": self.log_cap_bytes,
                    "cap_entries": self.log_cap_entries, "full": self.log_full},
            # messaging connections (one per remote group: they carry the streams) held
            # now, and the freed ones as ranges of seqs
            "group_connections": {"open": len(e.conns), "closed_ranges": e.closed.ranges(),
                                  "freed": e.stats.get("freed", 0)},
            "stats": {**dict(self.stats),
                      **{f"msg_{k}": v for k, v in self.messaging.stats.items()}},
        }
    # ==== end of the public API of the runtime ==============================================

    # ---- sans-IO surface -----------------------------------------------------------------
    def start(self, now_us: int) -> None:
        self._now = max(self._now, now_us)
        self._touched().start(now_us)
        # start() draws the birth id the member applies with (a new one)
        self._fresh_messaging()
        self._settle()

    def handle_message(self, msg: Message, now_us: int) -> None:
        self._now = max(self._now, now_us)
        t = msg.type
        m = self.membership
        if msg.src_group == self.group and m.members and msg.sender == m.members[0].birth:
            m.primary_spoke(now_us)         # any message: it is not silent to us
        if (t is MsgType.PROBE and msg.body["answer"] and msg.src_group != self.group
                and m.takeover_held):
            b = msg.body                    # evidence (or not) for a held takeover
            self._touched().probe_answered(b["primary"], b["pvn"], b["ago"], now_us,
                                           b["quiet"], b["size"], b["listen"])
        if t in MEMBERSHIP_CORE_TYPES:
            self._touched().handle_message(msg, now_us)
        elif t == MsgType.HEARTBEAT:
            self._touched().handle_message(msg, now_us)
            if self.live and msg.ts > 0:
                self.messaging.handle_message(msg, now_us)
        elif self.live:
            self.messaging.handle_message(msg, now_us)
        elif t == MsgType.ORDER_INFO:
            self._order_info_before_state(msg)
        self._settle()

    @property
    def takes_datagrams(self) -> bool:
        """Its messaging core takes whole datagrams (a native lane): the driver offers
        each one before decoding it (`handle_datagram`)."""
        return getattr(self.messaging, "takes_datagrams", False)

    def handle_datagram(self, datagram: bytes, now_us: int) -> bool:
        """A datagram as received, to a messaging lane that handles steady ones raw: a
        remote primary's message on a lent connection (a backup's lane). False: not
        taken, nothing changed (the driver decodes it and calls `handle_message`).
        What `handle_message` does besides messaging is for our own group's messages,
        PROBEs and membership's, which no lane takes raw."""
        if not self.live:
            return False
        raw = getattr(self.messaging, "handle_datagram", None)
        if raw is None or not raw(datagram, now_us):
            return False
        self._now = max(self._now, now_us)
        self._settle()
        return True

    def _order_info_before_state(self, msg: Message) -> None:
        """A joiner whose state is on its way keeps the order info its primary sends the
        backups meanwhile and says how much of it it holds without a hole (JOINER_OI_ACK,
        at every ORDER_INFO, as a backup re-acks one): the primary's output commit then
        counts it as it counts its backups (messaging `_on_joiner_oi_ack`) instead of
        holding every reply until the transfer ends. Restored, it delivers what it kept
        past its checkpoint (`_apply_restore`). Bounded: beyond MAX_EARLY_OI_* nothing
        more is kept, the acks stop advancing, and output commit waits as before."""
        m = self.membership
        if (m.status is not mb.Status.AWAITING_STATE or not m.members
                or msg.sender != m.members[0].birth or msg.pvn != m.pvn
                or msg.src_group != self.group or msg.dst_group != self.group):
            return
        tr = mg.unpack_trailer(msg.order_info)
        sec = tr[1] if tr is not None else None
        if sec is None or sec[0] != m.pvn:
            return
        if self._early_pvn != m.pvn:
            self._early_oi, self._early_pvn, self._early_bytes = {}, m.pvn, 0
        early = self._early_oi
        _, first, chunks = sec
        for i, ch in enumerate(chunks):
            pos = first + i
            if pos in early:
                continue
            if (len(early) >= MAX_EARLY_OI_POSITIONS
                    or self._early_bytes + len(ch) > MAX_EARLY_OI_BYTES):
                self._count("early_oi_full")
                break
            early[pos] = ch
            self._early_bytes += len(ch)
        if not early:
            return
        lo, hi = self._early_run()
        self._count("joiner_oi_acks_sent")
        self._emit(mg.Send(self.group, m.message(MsgType.JOINER_OI_ACK,
                                                 {"upto": hi, "from": lo})))

    def _early_run(self) -> tuple[int, int]:
        """The run of kept positions without a hole from the lowest one: (first, last)."""
        lo = hi = min(self._early_oi)
        while hi + 1 in self._early_oi:
            hi += 1
        return lo, hi

    def heard_again(self, msg: Message, times_us: list[int]) -> None:
        """Byte-identical copies of `msg`, a message this node was given, arrived at
        `times_us` (ascending, none after now): the driver absorbed them (`Pulse`) and
        hands them in before its next event, which is then judged with them. The copies
        say that their sender lived (membership's `note_copies`); the last is handled
        as any message."""
        if not times_us:
            return
        if len(times_us) > 1:
            self._touched().note_copies(msg, times_us[:-1])
        self.handle_message(msg, times_us[-1])

    def handle_timer(self, now_us: int) -> None:
        self._now = max(self._now, now_us)
        d = self._membership_next(0)
        if d is not None and d <= now_us:
            self._touched().handle_timer(now_us)
        if self.live:
            d = self.messaging.next_timer_us()
            if d is not None and d <= now_us:
                self.messaging.handle_timer(now_us)
        self._settle()

    @property
    def takeover_held(self) -> bool:
        """Membership's detector fired and waits for evidence (`Membership.takeover_held`):
        the driver then reads the pulse socket before each message."""
        return self.membership.takeover_held

    def _touched(self) -> mb.Membership:
        """Membership, about to change: its next deadline is computed again."""
        self._mb_next = None
        return self.membership

    def next_timer_us(self, watched: bool = True) -> int | None:
        """The next deadline; `watched` False: leaving out the `silence_watches`."""
        ds = [self._membership_next(0 if watched else 1)]
        if self.live:
            ds.append(self.messaging.next_timer_us())
        ds = [d for d in ds if d is not None]
        return min(ds) if ds else None

    def silence_watches(self) -> list[tuple[int, int, int]]:
        """Membership's deadlines that only a peer's silence brings (messaging has none):
        `Membership.silence_watches`."""
        return self._membership_next(2)

    def _membership_next(self, i: int):
        """Membership's next deadline (i = 0), without its watches (1), its watches (2)
        (`Membership.deadlines`), computed once after membership last changed (the
        driver asks after every event: most are messaging's, and membership's walks
        every peer's detector)."""
        if self._mb_next is None:
            self._mb_next = self.membership.deadlines()
        return self._mb_next[i]

    def take_actions(self) -> list[NodeAction]:
        out = list(self._actions)
        self._actions.clear()
        return out

    # ---- application ---------------------------------------------------------------------
    def open(self, remote_group: str, conn_seq: int, role: Role = Role.CLIENT) -> mg.ConnId:
        if not self.live:
            raise NotReady("the replica holds no group state yet")
        cid = self.messaging.open(remote_group, conn_seq, role)
        self.streams.setdefault(cid, bytearray())
        return cid

    def send_space(self, conn: mg.ConnId) -> int:
        if self.output_commit_holds():
            return self.skip_out.get(conn, 0)
        return self.messaging.send_space(conn) + self.skip_out.get(conn, 0)

    def in_flight(self, conn: mg.ConnId) -> int:
        """Our messages on `conn` not yet covered at the remote group (messaging's)."""
        return self.messaging.in_flight(conn) if self.live else 0

    def output_commit_holds(self) -> bool:
        """Output commit: a primary's output may leave only while every order-info entry
        it may depend on is held by the backups or fits in the message's piggyback (the
        remote group then holds it for a successor's phase 2)."""
        return (self.messaging.is_primary and self.messaging.order_info_unprotected_bytes()
                > self.messaging_config.max_piggyback_bytes)

    def order_info_held(self) -> bool:
        """Every order-info entry handed to messaging is held by every backup (a primary
        with no backup holds it alone): the output commit of an EXTERNAL send, which
        carries no piggyback and reaches no group that could reflect it."""
        return not self.messaging.is_primary or self.messaging.order_info_unprotected_bytes() == 0

    def leave(self, now_us: int) -> bool:
        """We stop for good: a primary's senior backup takes over at once, a backup's
        primary removes it at once (membership `leave`). True if the group was told."""
        self._now = max(self._now, now_us)
        told = self._touched().leave(now_us)
        self._settle()                      # the LEAVE goes out
        if told:
            # and nothing of ours after it: the group's next view forms at once, and a
            # heartbeat of our view's primary still heard then (the pulse repeats it until
            # the process is gone) was a competing primary to its members (one reset itself)
            self._gone = True
            self._actions.append(Pulse(self.group, None, 0, 0))
        return told

    def want_order_info(self, now_us: int) -> None:
        """An external send waits until the backups hold every order-info entry so far
        (`order_info_held`): messaging sends them to the backups now."""
        if self.live:
            self._now = max(self._now, now_us)
            self.messaging.want_order_info(now_us)
            self._settle()

    def send(self, conn: mg.ConnId, data: bytes, now_us: int) -> int:
        """The application wrote `data` on `conn`; returns the bytes accepted. A restored
        backup's replay re-writes what the group already sent: those are swallowed."""
        if not self.live:
            raise NotReady("the replica holds no group state yet")
        self._now = max(self._now, now_us)
        n = 0
        skip = self.skip_out.get(conn, 0)
        if skip:
            n = min(skip, len(data))
            self.skip_out[conn] = skip - n
            data = data[n:]
        if data and self.output_commit_holds():
            self._count("output_commit_waits")
        elif data:
            n += self.messaging.send(conn, data, now_us)
        self._settle()
        return n

    def close(self, conn: mg.ConnId, abort: bool, now_us: int) -> None:
        """The application closed (or, `abort`, reset) its side of `conn`."""
        if not self.live:
            raise NotReady("the replica holds no group state yet")
        self._now = max(self._now, now_us)
        self.messaging.close(conn, abort, now_us)
        self._settle()

    def add_order_info(self, chunk: bytes, now_us: int) -> int:
        """The primary's order-info entry (the determinizer's chunk); its position."""
        # Not before the view's marker: a new primary takes its predecessor's last order
        # info (recovered in phase 2) first, and its application must replay all of it
        # before it makes a choice of its own.
        if (self.membership.status is not mb.Status.PRIMARY or not self.live
                or self.started_pvn != self.messaging.pvn):
            raise NotReady("order info comes from a primary whose view has started")
        self._now = max(self._now, now_us)
        entry = bytes([APP_TAG]) + chunk
        pos = self.messaging.add_order_info(entry, now_us)
        self._log_order_info(self.messaging.pvn, pos, entry)
        self._settle()
        return pos

    def stream(self, conn: mg.ConnId) -> bytes:
        """Every byte this replica delivered on `conn` since the group started."""
        return bytes(self.streams.get(conn, b""))

    # ---- StateProvider (membership calls these) ------------------------------------------
    def checkpoint(self) -> bytes | None:
        if self.log_full is not None:
            self._count("checkpoints_refused")
            return None                     # membership removes the joiner (docs/LOG.md)
        blob = {"v": CHECKPOINT_VERSION,
                "streams": [[cid[0], cid[1], int(cid[2]), bytes(b)]
                            for cid, b in self.streams.items()],
                "ends": [[cid[0], cid[1], int(cid[2]), abort] for cid, abort in self.ends.items()],
                "oi": [list(x) for x in self.order_info_log],
                "messaging": self.messaging.snapshot(), "app": self.app_state.checkpoint()}
        self._count("checkpoints")
        return msgpack.packb(blob, use_bin_type=True)

    def restore(self, data: bytes) -> None:
        self._restore_blob = data           # applied on StateRestored (after set_view)

    # ---- settling --------------------------------------------------------------------------
    def _settle(self) -> None:
        for _ in range(MAX_SETTLE_ROUNDS):
            busy = False
            for a in self.membership.take_actions():
                busy = True
                self._on_membership(a)
            if self.live:
                for a in self.messaging.take_actions():
                    busy = True
                    if not self._leaving:
                        # after an abandon, what the old endpoint still had queued (the
                        # entries behind a view marker this replica's history contradicts)
                        # never reaches the application that is about to be replaced
                        self._on_messaging(a)
            if not busy:
                self._served_news()
                return
        raise RuntimeError(f"cores kept feeding each other for {MAX_SETTLE_ROUNDS} rounds")

    def _served_news(self) -> None:
        """Our branch became served (or stopped): both cores' heartbeats say it."""
        served = self.live and self.messaging.served
        if served != self._served_said:
            self._served_said = served
            self._heartbeat_news()

    def _heartbeat_news(self) -> None:
        """What our HEARTBEATs say changed outside the cores' sight: the next ones go now
        rather than after the repetition of the last (`Pulse`, up to a refresh), which
        said otherwise (`Membership.heartbeat_news`, `heartbeat_soon`)."""
        self._touched().heartbeat_news(self._now)
        self.messaging.heartbeat_soon()

    def _emit(self, action: NodeAction) -> None:
        if self._gone and isinstance(action, (mg.Send, Pulse)):
            return                          # left the group: no word of ours any more
        if not isinstance(action, ACTION_TYPES):
            raise TypeError(f"{action!r} is not a node action (llft/replica/actions.py)")
        if len(self._actions) >= MAX_HELD_ACTIONS:
            raise RuntimeError(f"more than MAX_HELD_ACTIONS={MAX_HELD_ACTIONS} not taken")
        self._actions.append(action)

    def _set_view(self, pvn: int, members) -> None:
        self.messaging.lineage = self.membership.lineage
        self.messaging.change = self.membership.change
        self.messaging.set_view(pvn, members[0].birth,
                                [(k.birth, k.precedence) for k in members],
                                self.birth, self._now)

    def _on_membership(self, a: mb.Action) -> None:
        now = self._now
        if isinstance(a, (mb.Send, Pulse)):
            self._emit(a)
        elif isinstance(a, mb.MembershipChanged):
            if self.live and a.birth == self.birth:
                self._set_view(a.pvn, a.members)
            self._emit(a)
        elif isinstance(a, mb.BeginPhase2):
            if not self.live:
                # a founder: no view, no connection, nothing to resynchronise
                self.live = True
                self._set_view(a.pvn, a.members)
                self.messaging.take_actions()           # nothing of a fresh endpoint
                self._touched().phase2_complete(a.pvn, now)
            else:
                self._set_view(a.pvn, a.members)
            self._emit(a)
        elif isinstance(a, mb.ViewStarted):
            if self.live and self.messaging.is_primary:
                prev = self._catch_up_backups(a.pvn)
                marker = encode_view_marker(a.pvn, prev)
                pos = self.messaging.add_order_info(marker, now)
                self._log_order_info(a.pvn, pos, marker)
                self.started_pvn = a.pvn
                self._emit(ViewSwitch(a.pvn, pos, True))
            self._emit(a)
        elif isinstance(a, mb.StateRestored):
            self._apply_restore()
            self._emit(a)
        elif isinstance(a, mb.Reset):
            self._emit(Pulse(self.group, None, 0, 0))   # the old incarnation falls silent
            self._leaving = False
            self._fresh_messaging()
            self._count("resets")
            self._emit(RestartApp(a.old_birth, a.new_birth, a.reason))
            self._emit(a)
        elif isinstance(a, (mb.ViewEntered, mb.JoinRefused)):
            self._emit(a)                               # status only / the runtime stops
        else:
            raise TypeError(f"unknown membership action {a!r}")

    def _on_messaging(self, a: Any) -> None:
        if isinstance(a, mg.Send):
            if a.msg.type == MsgType.HEARTBEAT:
                self._touched().heartbeat_carried(a.msg, self._now)   # ours may wait
            self._emit(a)
        elif isinstance(a, Pulse):
            self._touched().heartbeat_carried(a.msg, self._now, a.until_us)  # ours may wait
            self._emit(a)
        elif isinstance(a, mg.Deliver):
            buf = self.streams.setdefault(a.conn, bytearray())
            end = self.stream_base.get(a.conn, 0) + len(buf)    # delivered up to
            off, data = a.offset, a.data
            if off + len(data) <= end:
                self._count("dup_delivery")
                return
            if off < end:
                data, off = data[end - off:], end
            if off > end:
                self._count("gap_delivery")             # a messaging bug: the sim says so
            if self.log_full is None:
                self.input_bytes += len(data)
                buf += data
                self._check_log_cap()
            else:
                self.stream_base[a.conn] = off + len(data)
            self._emit(Deliver(a.conn, off, data))
        elif isinstance(a, mg.DeliverOrderInfo):
            self._deliver_order_info(a.pvn, a.pos, a.chunk)
        elif isinstance(a, mg.Phase2Done):
            self._touched().phase2_complete(a.pvn, self._now)
            self._emit(a)
        elif isinstance(a, mg.RecoveredOrderInfo):
            self._recovered(a)
            self._emit(a)
        elif isinstance(a, mg.Closed):
            self.ends[a.conn] = a.abort
            self._emit(a)
        elif isinstance(a, mg.Freed):
            self.skip_out.pop(a.conn, None)
            self._emit(a)
        elif isinstance(a, (mg.Opened, mg.Resynced)):
            self._emit(a)
        else:
            raise TypeError(f"unknown messaging action {a!r}")

    def _deliver_order_info(self, pvn: int, pos: int, entry: bytes,
                            recovered: bool = False) -> None:
        """Entry `pos` of view `pvn`, in order: at a backup from messaging or inside a
        catch-up; at a new primary `recovered` in phase 2 (an old view's: its markers
        are history, not views to enter)."""
        marker = decode_view_marker(entry)
        carried = decode_catch_up(entry)
        if marker is not None:
            view, prev_pvn, prev_end = marker
            self._log_order_info(pvn, pos, entry)
            if recovered:
                return
            differs = self._history_differs(view, prev_pvn, prev_end)
            if differs:
                self._count("history_differs")
                self._abandon(differs)
                return
            self._touched().view_entered(view, self._now)
            self._emit(ViewSwitch(view, pos, False))
        elif entry[:1] == bytes([APP_TAG]):
            self._log_order_info(pvn, pos, entry)
            self._emit(OrderInfo(pvn, pos, entry[1:]))
        elif carried is not None:
            self._log_order_info(pvn, pos, entry)
            old_pvn, old_pos, inner = carried
            have = self.oi_upto.get(old_pvn, 0)
            if old_pos == have + 1:
                self._count("caught_up_entries")
                self._deliver_order_info(old_pvn, old_pos, inner, recovered)
            elif old_pos > have + 1:
                self._count("catch_up_gap")     # the new primary re-sent too little
                self._abandon(
                    f"order info of view {old_pvn} missing from {have + 1} to "
                    f"{old_pos - 1} (the new primary did not re-send them)")
        else:
            self._count("bad_order_info_tag")

    def _abandon(self, reason: str) -> None:
        """Rejoin as a new member (membership resets us); until the reset is taken, the
        messaging endpoint's further actions are dropped."""
        m = self._touched()
        if m.is_member():
            self._leaving = True
            m.abandon(reason, self._now)

    def _history_differs(self, view: int, prev_pvn: int, prev_end: int) -> str | None:
        """A backup at the marker of `view`: why the order info it delivered is not the
        new primary's history up to (prev_pvn, prev_end), or None. Ahead, its
        application executed choices the group will not keep; behind, it cannot make
        the choices the new primary's application made."""
        if not prev_pvn:
            return None
        have = self.oi_upto.get(prev_pvn, 0)
        if have != prev_end:
            return (f"holds order info of view {prev_pvn} up to {have}, the primary of "
                    f"view {view} ended it at {prev_end}")
        later = [p for p, q in self.oi_upto.items() if prev_pvn < p < view and q > 0]
        if later:
            return (f"holds order info of view {later[0]}, which the primary of view "
                    f"{view} never had")
        return None

    def views_ended(self) -> dict[int, int]:
        """The last order-info position this replica holds of each view (logs)."""
        return dict(sorted(self.oi_upto.items()))

    def _catch_up_backups(self, pvn: int) -> tuple[int, int]:
        """A new primary, before its view marker: re-send the previous view's tail to the
        backups (module docstring, "Catch-up"); returns (previous view, its end)."""
        older = [p for p, q in self.oi_upto.items() if p < pvn and q > 0]
        if not older:
            return (0, 0)
        prev = max(older)
        end = self.oi_upto[prev]
        acks = self.messaging.peer_order_info_acks(prev)
        floor = min((acks.get(b, 0) for b in self.messaging.backups), default=end)
        if floor >= end:
            return (prev, end)
        # From the log's end: this is on the failover path, and the log holds the group's
        # whole history. A view's entries are logged once each, in position order. The
        # newest that fit the budget go; a backup short of more rejoins.
        budget = self.messaging_config.max_order_info_bytes // 2
        tail: list[tuple[int, bytes]] = []
        for p, q, e in reversed(self.order_info_log):
            if p != prev:
                continue
            budget -= len(e) + CATCH_UP_HEADER
            if q <= floor or budget < 0:
                break
            tail.append((q, e))
        tail.reverse()
        if not tail or tail[-1][0] != end:
            self._count("catch_up_unavailable")     # (the log was dropped at its cap)
            return (prev, end)
        for q, e in tail:
            self._count("catch_up_sent")
            entry = encode_catch_up(prev, q, e)
            self._log_order_info(pvn, self.messaging.add_order_info(entry, self._now), entry)
        return (prev, end)

    def _recovered(self, a: mg.RecoveredOrderInfo) -> None:
        """Phase 2 at a new primary: the old primary's last order info, reflected by a
        remote primary. Entries beyond what this replica delivered are delivered now,
        as ordinary `OrderInfo`, and logged (a backup that joins later replays them)."""
        upto = self.oi_upto.get(a.pvn, 0)
        for i, ch in enumerate(a.chunks):
            pos = a.first_pos + i
            if pos <= upto:
                continue
            if pos != upto + 1:
                self._count("recovered_gap")    # entries missing: the app will stall
                return
            upto = pos
            self._count("recovered_entries")
            self._deliver_order_info(a.pvn, pos, ch, recovered=True)

    def _log_order_info(self, pvn: int, pos: int, entry: bytes) -> None:
        if pos > self.oi_upto.get(pvn, 0):
            self.oi_upto[pvn] = pos
        if self.log_full is None:
            self.order_info_log.append((pvn, pos, entry))
            self.oi_log_bytes += len(entry)
            self._check_log_cap()

    def _check_log_cap(self) -> None:
        """The log reached its cap: drop it, keep the stream offsets (docs/LOG.md)."""
        if (self.input_bytes + self.oi_log_bytes <= self.log_cap_bytes
                and len(self.order_info_log) <= self.log_cap_entries):
            return
        self.log_full = (f"the group's log reached its cap ({self.input_bytes} input bytes "
                         f"+ {self.oi_log_bytes} order-info bytes, "
                         f"{len(self.order_info_log)} entries; caps {self.log_cap_bytes} "
                         f"bytes, {self.log_cap_entries} entries)")
        self._count("log_full")
        for cid, buf in self.streams.items():
            self.stream_base[cid] = self.stream_base.get(cid, 0) + len(buf)
            buf.clear()
        self.order_info_log.clear()

    # ---- a joining backup applies the checkpoint ---------------------------------------
    def _apply_restore(self) -> None:
        blob = msgpack.unpackb(self._restore_blob or b"\x80", raw=False)
        self._restore_blob = None
        m = self.membership
        self.live = True
        self._set_view(m.pvn, m.members)
        if not blob:
            return
        if blob.get("v") != CHECKPOINT_VERSION:
            raise ValueError(f"checkpoint version {blob.get('v')} unknown")
        streams = {(remote, seq, Role(role)): bytes(data)
                   for remote, seq, role, data in blob["streams"]}
        for cid, data in streams.items():
            self.streams[cid] = bytearray(data)
            self.input_bytes += len(data)
        for remote, seq, role, abort in blob.get("ends", ()):
            self.ends[(remote, seq, Role(role))] = bool(abort)
        for pvn, pos, entry in blob["oi"]:
            self._log_order_info(pvn, pos, entry)
        for cid, out_offset in self.messaging.restore(blob["messaging"]).items():
            self.skip_out[cid] = out_offset     # the group already sent these bytes
            self.streams.setdefault(cid, bytearray())
            streams.setdefault(cid, b"")
        self.app_state.restore(blob["app"])
        # from the blob: a joiner whose own log fills up while restoring still replays all
        self._emit(Restored(tuple(streams.items()),
                            tuple((p, q, e[1:]) for p, q, e in blob["oi"]
                                  if e[:1] == bytes([APP_TAG])),
                            blob["app"], tuple(self.ends.items()),
                            tuple(self.oi_upto.items())))
        for cid in self.streams:
            if cid not in self.messaging.conns:
                # the group freed it before we joined: the app replays it, no more
                self._emit(mg.Freed(cid))
        if self._early_oi and self._early_pvn == self.messaging.pvn:
            # what we acknowledged while the state came: past the checkpoint, delivered
            # now (the primary counts on it); its run starts at or below the checkpoint's end
            lo, hi = self._early_run()
            self.messaging.take_early_order_info(
                lo, [self._early_oi[p] for p in range(lo, hi + 1)])
            self._count("early_oi_delivered", hi - lo + 1)
        self._early_oi, self._early_bytes = {}, 0

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n
