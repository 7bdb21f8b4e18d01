"""A busy machine is not a dead peer: adaptive timeouts (membership/detector.py), local
stalls forgiven on every path, and the rejoin back-off (membership/core.py).

The cores are driven directly, with crafted messages and the timer at exactly the
times they ask for (`next_timer_us`), as the simulator and the asyncio driver do.
"""
from __future__ import annotations

import random
from typing import Callable

from llft.protocol.messages import Message, MsgType, Role
from membership.core import Config, Membership, Reset, Send, Status
from membership.detector import ARRIVAL_WINDOW, MARGIN, ArrivalStats, extension_us
from membership.rules import Key

G = "g"
CFG = Config(group=G)          # the defaults: heartbeat 5 ms, rank-2 timeout 25 ms
HB = CFG.heartbeat_interval_us
MS = 1_000


def hb(sender: int, prec: int, rank: int, pvn: int = 4, replay: int = 0) -> Message:
    return Message(MsgType.HEARTBEAT, G, G, 0, Role.CLIENT, pvn, prec, sender,
                   body={"rank": rank, "served": 0, "lineage": 0, "change": 0, "wait": 0,
                         "replay": replay, "rm": 0, "done": 0})


def propose_backup(sender: int) -> Message:
    return Message(MsgType.PROPOSE_BACKUP, G, G, 0, Role.CLIENT, 0, 0, sender,
                   body={"host": "h", "pid": 1})


def ack(sender: int, prec: int, change: int) -> Message:
    return Message(MsgType.ACCEPT_BACKUP_ACK, G, G, 0, Role.CLIENT, 4, prec, sender,
                   body={"change": change})


def core_in(status: Status, birth: int, members, cfg: Config = CFG, seed: int = 1) -> Membership:
    """A core placed directly into membership (pvn 4, `members` as (birth, precedence))."""
    core = Membership(cfg, random.Random(seed))
    core.start(0)
    core.birth = birth
    core.status = status
    core._install(4, 0, [Key(p, b) for b, p in members], max(p for _, p in members), 0)
    core.take_actions()
    return core


def sent(core: Membership, mtype: MsgType) -> list[Message]:
    return [a.msg for a in core.take_actions() if isinstance(a, Send) and a.msg.type is mtype]


def run_timers(core: Membership, until_us: int, feed=lambda now: None) -> int:
    """Fire the core's timer whenever it asks until `until_us`; `feed(now)` may deliver
    messages at each timer. Returns the last timer time."""
    now = 0
    while True:
        t = core.next_timer_us()
        if t > until_us:
            return now
        now = t
        feed(now)
        core.handle_timer(now)


# ---- the statistics ------------------------------------------------------------------

def test_regular_heartbeats_never_extend_a_timeout():
    st = ArrivalStats(0)
    for i in range(1, 500):
        st.arrived(i * HB)
    assert st.expected_silence_us() == HB
    assert extension_us(st, CFG.timeout_base_us, CFG.extension_cap_us) == 0


def test_a_gap_seen_extends_the_timeout_to_twice_it_until_it_leaves_the_window():
    st = ArrivalStats(0)
    t = 0
    for _ in range(50):
        t += HB
        st.arrived(t)
    t += 20 * MS                                  # the peer was starved for 20 ms
    st.arrived(t)
    assert extension_us(st, CFG.timeout_base_us, CFG.extension_cap_us) == \
        MARGIN * 20 * MS - CFG.timeout_base_us
    for _ in range(ARRIVAL_WINDOW):
        t += HB
        st.arrived(t)
    assert extension_us(st, CFG.timeout_base_us, CFG.extension_cap_us) == 0


def test_the_extension_is_capped_so_a_death_is_still_detected_in_bounded_time():
    st = ArrivalStats(0)
    st.arrived(10_000 * MS)                       # ten seconds of silence once
    assert extension_us(st, CFG.timeout_base_us, CFG.extension_cap_us) == \
        CFG.extension_cap_us == 3 * CFG.timeout_base_us
    assert extension_us(None, CFG.timeout_base_us, CFG.extension_cap_us) == 0


# ---- the backup's fault detector on the primary --------------------------------------

def _detect(gaps_us: list[int], catching_up: bool = False,
            catch_up=lambda now: 0) -> tuple[int, int]:
    """A rank-2 backup hears the primary every interval except the given gaps, then
    the primary dies: (time of its last heartbeat, time the backup proposes).
    `catch_up(now)`: the runtime's estimate of its own replay left, given at each timer."""
    c = core_in(Status.BACKUP, 105, ((100, 1), (105, 2), (111, 3)))
    c.set_catching_up(catching_up)
    plan, t = [], 0
    for _ in range(40):
        t += HB
        plan.append(t)
    for g in gaps_us:
        t += g
        plan.append(t)
        for _ in range(10):
            t += HB
            plan.append(t)
    last = plan[-1]
    pending = list(plan)

    def feed(now):
        c.set_catch_up_estimate(catch_up(now), now)
        while pending and pending[0] <= now:
            c.handle_message(hb(100, 1, 1), pending.pop(0))
    proposed = None
    now = 0
    while proposed is None and now < last + 2 * CFG.catch_up_wait_max_us:
        now = c.next_timer_us()
        feed(now)
        c.handle_timer(now)
        if sent(c, MsgType.PROPOSE_PRIMARY):
            proposed = now
    return last, proposed


def test_at_idle_the_primary_is_suspected_after_the_configured_timeout():
    last, proposed = _detect([])
    assert proposed - last == CFG.fault_timeout_us(2)


def test_a_primary_that_was_slow_before_gets_more_time_but_is_still_suspected():
    last, proposed = _detect([20 * MS])           # one 20 ms stall of the primary
    assert proposed - last == CFG.fault_timeout_us(2) + MARGIN * 20 * MS - CFG.timeout_base_us
    # larger and larger stalls survived: the detector learns them, up to its cap
    last, proposed = _detect([20 * MS, 35 * MS, 60 * MS, 90 * MS])
    assert proposed - last == CFG.fault_timeout_us(2) + CFG.extension_cap_us


def test_a_backup_still_replaying_its_history_waits_longest_then_suspects():
    # its replay is the machine's heaviest work and a takeover by it would be slow
    last, proposed = _detect([], catching_up=True)
    assert proposed - last == CFG.fault_timeout_us(2) + CFG.extension_cap_us
    last, proposed = _detect([], catching_up=False)    # caught up: the floor again
    assert proposed - last == CFG.fault_timeout_us(2)


def test_a_backup_waits_at_least_as_long_as_its_own_replay_would_take():
    # catching up with 2 s of replay left, the estimate shrinking as it replays: the
    # primary (dead at `last`) is replaced when the replay is done, not 2 s before it
    # (a paused primary resumes meanwhile and nothing changes)
    end = {}

    def replay_left(now):
        end.setdefault("t", now + 2_000 * MS) if now > 200 * MS else None
        return max(0, end["t"] - now) if "t" in end else 0
    last, proposed = _detect([], catching_up=True, catch_up=replay_left)
    assert end["t"] <= proposed <= end["t"] + CFG.heartbeat_interval_us
    # an app that makes no progress delays the takeover by a bounded time
    last, proposed = _detect([], catching_up=True, catch_up=lambda now: 10**12)
    assert proposed - last == CFG.fault_timeout_us(2) + CFG.catch_up_wait_max_us
    # a replay that ends within the usual timeout changes nothing (the last heartbeat
    # of the primary comes at 200 ms: 10 ms of replay left then)
    last, proposed = _detect([], catching_up=False,
                             catch_up=lambda now: max(0, 210 * MS - now))
    assert proposed - last == CFG.fault_timeout_us(2)


# ---- a senior backup that waits longer is not excluded by a junior -------------------

def _takeover(senior: Callable[[Membership], None], senior_dies_us: int | None = None):
    """The primary (100) dies at 200 ms; backups 105 (rank 2) and 111 (rank 3) hear it
    and each other (their messages delivered at once). `senior(core)` sets rank 2's
    own condition. Returns ({birth: time it proposed}, {birth: reset reasons},
    the time of the primary's last heartbeat)."""
    cores = {b: core_in(Status.BACKUP, b, ((100, 1), (105, 2), (111, 3)), seed=b)
             for b in (105, 111)}
    senior(cores[105])
    last = 200 * MS
    proposed, resets, now = {}, {}, 0
    def alive(b: int, now: int) -> bool:
        return b != 105 or senior_dies_us is None or now < senior_dies_us
    while now < 2_000 * MS and not any(c.status is Status.PRIMARY_PHASE2
                                       for c in cores.values()):
        now = min([c.next_timer_us() for b, c in cores.items() if alive(b, now)]
                  + ([(now // HB + 1) * HB] if now < last else []))
        if now <= last and now % HB == 0:
            for b, c in cores.items():
                if alive(b, now):
                    c.handle_message(hb(100, 1, 1), now)
        for b, c in cores.items():
            if not alive(b, now):
                continue
            if c.next_timer_us() <= now:
                c.handle_timer(now)
            for a in c.take_actions():
                if isinstance(a, Reset):
                    resets.setdefault(b, []).append(a.reason)
                if not isinstance(a, Send) or a.msg.dst_group != G:
                    continue
                if a.msg.type is MsgType.PROPOSE_PRIMARY:
                    proposed.setdefault(b, now)
                for other, o in cores.items():
                    if other != b and alive(other, now):
                        o.handle_message(a.msg, now)
    return proposed, resets, last


def test_a_junior_backup_waits_for_a_senior_still_catching_up():
    # rank 2 is replaying its history (the longest extension): its detector fires at
    # floor + cap, later than rank 3's floor. Rank 3 learns it from its heartbeats and
    # waits as much, so rank 2 takes over as the ranks say and nobody is reset
    proposed, resets, last = _takeover(lambda c: c.set_catching_up(True))
    assert not resets
    assert min(proposed, key=proposed.get) == 105
    assert proposed[105] - last == CFG.fault_timeout_us(2) + CFG.extension_cap_us
    assert 111 not in proposed or proposed[111] > proposed[105]


def test_a_junior_backup_waits_for_a_senior_held_by_its_replay_estimate():
    # rank 2 has 600 ms of replay left when the primary dies: it takes over then
    proposed, resets, last = _takeover(
        lambda c: c.set_catch_up_estimate(600 * MS, 200 * MS))
    assert not resets
    assert min(proposed, key=proposed.get) == 105
    assert proposed[105] == 800 * MS


def test_a_junior_backup_does_not_wait_for_a_senior_that_died_too():
    # rank 2 catching up dies 50 ms after the primary: rank 3 takes over once it has
    # been silent as long as a primary would be suspected, and leaves it out
    proposed, resets, last = _takeover(lambda c: c.set_catching_up(True),
                                       senior_dies_us=250 * MS)
    assert list(proposed) == [111]
    assert proposed[111] - 250 * MS <= CFG.fault_timeout_us(3) + CFG.extension_cap_us
    assert proposed[111] - last >= CFG.fault_timeout_us(3)


# ---- the primary: ack timeouts and silent backups ------------------------------------

def test_the_ack_timeout_of_a_change_follows_each_members_timing():
    p = core_in(Status.PRIMARY, 100, ((100, 1), (105, 2), (111, 3)))
    t = 0
    while t < 3_000 * MS:                         # 105 speaks every 40 ms, 111 every 5
        t += HB
        if t % (40 * MS) == 0:
            p.handle_message(hb(105, 2, 2), t)
        p.handle_message(hb(111, 3, 3), t)
        p.handle_timer(t)
    p.take_actions()
    p.handle_message(propose_backup(130), t)      # admission: AcceptBackup, change 1
    assert sent(p, MsgType.ACCEPT_BACKUP)
    start = t
    p.handle_message(ack(111, 3, 1), t)
    p.handle_message(ack(130, 0, 1), t)
    expected = CFG.ack_timeout_us + MARGIN * 40 * MS - CFG.ack_timeout_us   # 80 ms
    removed_at = None
    while removed_at is None and t < start + 500 * MS:
        t = p.next_timer_us()
        if t % (40 * MS) == 0:
            p.handle_message(hb(105, 2, 2), t)    # alive, but never acknowledges
        p.handle_message(hb(111, 3, 3), t)
        p.handle_message(hb(130, 4, 4), t)
        p.handle_timer(t)
        if sent(p, MsgType.REMOVE_BACKUP):
            removed_at = t
    assert removed_at - start == expected > CFG.ack_timeout_us


def test_a_stall_of_the_primary_seen_first_by_a_message_removes_no_one():
    """The primary is starved for 300 ms; the first event after it is a ProposeBackup
    (not its timer), whose handler ticks the primary: the backups' heartbeats are still
    queued behind it, so they must not look silent."""
    p = core_in(Status.PRIMARY, 100, ((100, 1), (105, 2), (111, 3)))
    t = run_timers(p, 100 * MS, feed=lambda now: (p.handle_message(hb(105, 2, 2), now),
                                                  p.handle_message(hb(111, 3, 3), now)))
    p.take_actions()
    t += 300 * MS                                 # no event at all: a local stall
    p.handle_message(propose_backup(130), t)
    acts = p.take_actions()
    assert not [a for a in acts if isinstance(a, Send)
                and a.msg.type is MsgType.REMOVE_BACKUP]
    assert {k.birth for k in p.members} == {100, 105, 111, 130}
    assert p.stalls == 1
    # the queued heartbeats arrive; the timer then runs: still one stall, no removal
    p.handle_message(hb(105, 2, 2), t)
    p.handle_message(hb(111, 3, 3), t)
    p.handle_timer(t + 1)
    assert p.stalls == 1 and not sent(p, MsgType.REMOVE_BACKUP)


def test_a_backup_stall_seen_first_by_a_message_does_not_suspect_the_primary():
    c = core_in(Status.BACKUP, 105, ((100, 1), (105, 2), (111, 3)))
    t = run_timers(c, 100 * MS, feed=lambda now: c.handle_message(hb(100, 1, 1), now))
    t += 300 * MS
    c.handle_message(hb(111, 3, 3), t)            # a stale heartbeat of the other backup
    c.handle_timer(t)
    assert c.status is Status.BACKUP and not sent(c, MsgType.PROPOSE_PRIMARY)
    # the gap it saw included its own stall: that is not learned as the primary's
    c.handle_message(hb(100, 1, 1), t)
    assert c._extension_us(100, CFG.timeout_base_us) == 0


# ---- rejoin back-off ---------------------------------------------------------------

def _removed(c: Membership, now: int) -> Reset:
    msg = Message(MsgType.REMOVE_BACKUP, G, G, 0, Role.CLIENT, c.pvn, 1, c.primary.birth,
                  body={"members": [[c.primary.birth, 1]], "old_members": [],
                        "change": c.change + 1, "max_precedence": 9, "lineage": 0})
    c.handle_message(msg, now)
    return next(a for a in c.take_actions() if isinstance(a, Reset))


def test_resets_in_a_row_back_off_exponentially_with_jitter_then_forget():
    c = core_in(Status.BACKUP, 105, ((100, 1), (105, 2)))
    waits, now = [], 10
    for _ in range(6):
        r = _removed(c, now)
        waits.append(r.rejoin_after_us)
        # admitted again at once (as the primary would), then removed again
        c.status = Status.BACKUP
        c._install(4, c.change, [Key(1, 100), Key(50 + len(waits), c.birth)], 60, now)
        c.take_actions()
        now += MS
    lo, hi = CFG.rejoin_backoff_min_us, CFG.rejoin_backoff_max_us
    assert waits[0] == 0                          # one reset is no storm
    for i, w in enumerate(waits[1:]):
        cap = min(hi, lo << i)
        assert cap // 2 <= w <= cap
    assert len(set(waits[1:])) > 1
    # a member for rejoin_stable_us: the next reset applies at once again
    assert _removed(c, now + CFG.rejoin_stable_us).rejoin_after_us == 0


def test_a_joiner_in_back_off_is_silent_and_founds_nothing_before_it_applies():
    c = core_in(Status.BACKUP, 105, ((100, 1), (105, 2)))
    _removed(c, 10)
    c.status = Status.BACKUP
    c._install(4, c.change, [Key(1, 100), Key(7, c.birth)], 9, 20)
    c.take_actions()
    r = _removed(c, 30)
    assert r.rejoin_after_us > 0
    t = 30
    while t < 30 + r.rejoin_after_us:
        t = c.next_timer_us()
        c.handle_timer(t)
        acts = c.take_actions()
        if t < 30 + r.rejoin_after_us:
            assert not acts and c.status is Status.JOINING
    assert t == 30 + r.rejoin_after_us
    assert any(isinstance(a, Send) and a.msg.type is MsgType.PROPOSE_BACKUP for a in acts)
    assert c.stalls == 0                          # a back-off is no stall


def test_a_new_member_borrows_the_timing_of_the_slowest_well_known_peer():
    p = core_in(Status.PRIMARY, 100, ((100, 1), (105, 2)))
    t = 0
    while t < 3_000 * MS:                         # 105 speaks every 40 ms
        t += HB
        if t % (40 * MS) == 0:
            p.handle_message(hb(105, 2, 2), t)
        p.handle_timer(t)
    p._install(4, 1, [Key(1, 100), Key(2, 105), Key(3, 130)], 3, t)   # 130: new, no state
    p.handle_message(hb(130, 3, 3), t + HB)
    assert p._extension_us(130, CFG.ack_timeout_us) == p._extension_us(105, CFG.ack_timeout_us) \
        == MARGIN * 40 * MS - CFG.ack_timeout_us


def test_a_member_receiving_the_state_gets_the_longest_timeouts():
    p = core_in(Status.PRIMARY, 100, ((100, 1), (105, 2)))
    t = run_timers(p, 200 * MS, feed=lambda now: p.handle_message(hb(105, 2, 2), now))
    p.handle_message(propose_backup(130), t)      # admitted: waits for our state
    assert 130 in {k.birth for k in p.members}
    assert p._backup_timeout_us(130) == CFG.backup_timeout_us + CFG.extension_cap_us
    assert p._backup_timeout_us(105) == CFG.backup_timeout_us


def _silent_removal_after(replay_then: int, replay_last: int) -> int:
    """The primary hears backup 105 every interval for 200 ms (its HEARTBEATs' `replay`
    `replay_then`, the last one's `replay_last`), then never again: how long after that
    last heartbeat the primary removes it."""
    p = core_in(Status.PRIMARY, 100, ((100, 1), (105, 2), (111, 3)))
    t = run_timers(p, 200 * MS, feed=lambda now: (
        p.handle_message(hb(105, 2, 2, replay=replay_then), now),
        p.handle_message(hb(111, 3, 3), now)))
    last = t + 1
    p.handle_message(hb(105, 2, 2, replay=replay_last), last)
    p.take_actions()
    while t < last + 2_000 * MS:
        t = p.next_timer_us()
        p.handle_message(hb(111, 3, 3), t)
        p.handle_timer(t)
        removals = sent(p, MsgType.REMOVE_BACKUP)
        if removals:
            assert [b for b, _ in removals[0].body["members"]] == [100, 111]
            return t - last
    raise AssertionError("never removed")


def test_a_backup_still_replaying_its_history_gets_the_longest_timeouts_at_the_primary():
    # a restarted Spark replica replaying 36,000 entries for 93 s with a cold JVM had
    # its loop wake 208 ms late once, was removed as silent, and started over with a
    # longer log: while its HEARTBEATs say `replay` it gets floor + cap, as while its
    # state was on its way; a dead one is still removed, in bounded time
    plain = _silent_removal_after(0, 0)
    assert CFG.backup_timeout_us <= plain < CFG.backup_timeout_us + HB * 2
    replaying = _silent_removal_after(1, 1)
    assert replaying - plain >= CFG.extension_cap_us - HB
    assert replaying < CFG.backup_timeout_us + CFG.extension_cap_us + HB * 2
    # caught up (its last heartbeat says so): the plain timeout again
    assert _silent_removal_after(1, 0) == plain


def test_a_backup_says_replay_in_its_heartbeats_while_catching_up_and_only_then():
    c = core_in(Status.BACKUP, 105, ((100, 1), (105, 2)))
    said = []
    for flag in (True, False):
        c.set_catching_up(flag)
        c._hb_due_us = 0
        c.handle_timer(c.next_timer_us())
        said += [m.body["replay"] for m in sent(c, MsgType.HEARTBEAT)]
    assert said == [1, 0]
    c.set_catching_up(True)                       # a primary says 0: nobody times it out so
    c.status = Status.PRIMARY
    assert c.replay_flag() == 0


class _BigState:
    """A long-lived group's log: 41 MiB to give a joiner."""
    def checkpoint(self) -> bytes:
        return bytes(41 << 20)

    def restore(self, data: bytes) -> None:
        pass


def test_a_joiner_given_a_large_state_gets_time_to_restore_it():
    """It restores the state as its last chunk arrives, before it acknowledges it (its
    agent silent meanwhile, ~0.5 s for 40 MB): the primary waits longer per MiB beyond
    the first, from the transfer's start until the joiner speaks again."""
    p = Membership(CFG, random.Random(1), state=_BigState())
    p.start(0)
    p.birth, p.status = 100, Status.PRIMARY
    p._install(4, 0, [Key(1, 100), Key(2, 105)], 2, 0)
    p.take_actions()
    t = run_timers(p, 200 * MS, feed=lambda now: p.handle_message(hb(105, 2, 2), now))
    p.handle_message(propose_backup(130), t)      # admitted
    p.handle_message(ack(105, 2, 1), t)
    p.handle_message(ack(130, 0, 1), t)           # the change commits: the transfer starts
    p.handle_timer(p.next_timer_us())
    assert sent(p, MsgType.STATE)
    allowance = 40 * CFG.restore_allowance_us_per_mib
    assert p._backup_timeout_us(130) == (CFG.backup_timeout_us + CFG.extension_cap_us
                                         + allowance)
    assert p._backup_timeout_us(105) == CFG.backup_timeout_us
    p._settling[130] = 1                          # transfer acknowledged, settling
    p.handle_message(hb(130, 3, 3), t)            # it speaks: restored
    assert p._backup_timeout_us(130) == CFG.backup_timeout_us + CFG.extension_cap_us


# ---- heartbeats carried by another core (llft/replica/node.py) ------------------------

def test_a_member_whose_heartbeats_are_carried_sends_none_and_still_forgives_a_stall():
    """Messaging's HEARTBEAT with membership's header stands for membership's own: while
    it goes every interval the core sends none, yet its timer still runs every interval
    (a member admitted before its timer ever ran included: `llft simulate replica` seed
    17747229888770697107 once took over from a live primary after a 73 ms pause), so a
    local stall is still told from a silent primary."""
    c = core_in(Status.BACKUP, 105, ((100, 1), (105, 2), (111, 3)))
    c._last_tick_us = None                        # admitted before its first tick
    now, ticks, own, mg_next = 0, [], 0, 0        # messaging's heartbeat: every HB from 0
    while now < 100 * MS:
        now = min(c.next_timer_us(), mg_next)
        if c.next_timer_us() <= now:
            c.handle_timer(now)
            ticks.append(now)
        own += len(sent(c, MsgType.HEARTBEAT))
        if mg_next <= now:                        # the node: after membership's timer
            c.heartbeat_carried(hb(105, 2, 2), now)
            c.handle_message(hb(100, 1, 1), now)
            mg_next = now + HB
    assert own == 0 and c.heartbeats_carried == len(ticks) + 1 == 21
    assert ticks[0] <= HB and max(b - a for a, b in zip(ticks, ticks[1:])) <= HB
    now += 70 * MS                                # no event at all: a local stall
    c.handle_message(hb(111, 3, 3), now)
    c.handle_timer(now)
    assert c.stalls == 1
    assert c.status is Status.BACKUP and not sent(c, MsgType.PROPOSE_PRIMARY)


def test_carried_heartbeats_are_the_ticks_one_wake_up_per_interval():
    """Messaging's heartbeat timer runs at its own phase; once its heartbeats are carried,
    membership's tick falls due with them: the two cores wake the loop once per interval,
    not twice (an idle agent's cost is its wake-ups)."""
    c = core_in(Status.BACKUP, 105, ((100, 1), (105, 2), (111, 3)))
    c.handle_timer(0)
    c.take_actions()
    wakeups, mg_next, now = [], HB // 3, 0           # messaging's phase: a third of one off
    while now < 100 * MS:
        now = min(c.next_timer_us(), mg_next)
        wakeups.append(now)
        if c.next_timer_us() <= now:
            c.handle_timer(now)
        if mg_next <= now:
            c.heartbeat_carried(hb(105, 2, 2), now)
            c.handle_message(hb(100, 1, 1), now)
            c.handle_message(hb(111, 3, 3), now)
            mg_next = now + HB
        c.take_actions()
    assert len(wakeups) <= 100 * MS // HB + 2
    assert c.stalls == 0 and c.status is Status.BACKUP


def test_own_heartbeats_resume_within_one_and_a_half_intervals_when_none_is_carried():
    c = core_in(Status.BACKUP, 105, ((100, 1), (105, 2)))
    c.handle_timer(c.next_timer_us())
    c.take_actions()
    c.heartbeat_carried(hb(105, 2, 2, pvn=3), 10 * MS)    # another view's: not ours
    c.heartbeat_carried(hb(105, 2, 2), 10 * MS)
    assert c.heartbeats_carried == 1
    now = 10 * MS
    while not sent(c, MsgType.HEARTBEAT):
        now = c.next_timer_us()
        c.handle_message(hb(100, 1, 1), now)
        c.handle_timer(now)
    assert now == 10 * MS + HB + HB // 2
