"""Unit tests of the membership rules and core (membership/), plus a short sim campaign.

Rules are tested as the paper states them (membership/rules.py); the core is tested on
the simulator kernel without faults (deterministic, delays 50-300 us) and by feeding
crafted messages straight into `handle_message`.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st

from llft.protocol.messages import Message, MsgType, Role
from llft.sim.kernel import NetConfig, Sim
from llft.sim import membership_check as simcheck
from llft.sim.campaign import Outcome, Script
from membership.core import (MAX_MEMBERS, MAX_PENDING_JOINERS, BeginPhase2, Config, Membership,
                             MembershipChanged, Reset, Send, StateRestored, Status, ViewStarted)
from membership.rules import (Key, PPDecision, decide_propose_primary, fault_timeout_us,
                              may_propose, proposal_members)

G = "g"
CFG = Config(group=G)


# ---- rules ----------------------------------------------------------------------------

def test_fault_timeouts_grow_with_rank_as_in_the_paper():
    # the paper's example: rank 2 waits 10 ms; rank 3 allows 10 ms of the primary's
    # inaction, 10 ms of the rank-2 backup's and 10 ms of skew: 30 ms
    t = [fault_timeout_us(r, timeout_base_us=10_000, inaction_us=10_000, skew_us=10_000)
         for r in (2, 3, 4)]
    assert t == [10_000, 30_000, 50_000]
    assert [CFG.fault_timeout_us(r) for r in (2, 3, 4, 5)] == [25_000, 75_000, 125_000, 175_000]
    with pytest.raises(ValueError):
        fault_timeout_us(1, timeout_base_us=1, inaction_us=1, skew_us=1)


A, B, C, D = Key(1, 10), Key(2, 20), Key(3, 30), Key(4, 40)


def decide(**kw):
    base = dict(target=2, my_pvn=1, my_key=C, proposer=B, included=True,
                generated_target=None, acked=None, seen_max=None, accepted_by_proposal=False)
    base.update(kw)
    return decide_propose_primary(**base)


@pytest.mark.parametrize("case, kw, expected", [
    # lines 21-24: included, not generated, no higher proposer acknowledged -> accept
    ("accept", {}, PPDecision.ACCEPT),
    ("accept again (retransmission)", dict(acked=B), PPDecision.ACCEPT),
    ("ignore: we generated one for v+1", dict(generated_target=2), PPDecision.IGNORE),
    ("ignore: acked a higher proposer", dict(acked=D, proposer=B), PPDecision.IGNORE),
    ("accept higher over acked lower", dict(acked=B, proposer=Key(3, 5), my_key=D,
                                            target=2, my_pvn=2, accepted_by_proposal=True),
     PPDecision.ACCEPT),
    ("ignore: view already entered", dict(my_pvn=2, accepted_by_proposal=False),
     PPDecision.IGNORE),
    ("ignore: included for v+2", dict(target=3), PPDecision.IGNORE),
    # line 25: not included -> reset, unless we compete and win, or a higher one exists
    ("reset: excluded", dict(included=False), PPDecision.RESET),
    ("reset: excluded, later view", dict(included=False, target=5), PPDecision.RESET),
    ("reset: we generated but are lower", dict(included=False, my_key=B, proposer=C,
                                                generated_target=2), PPDecision.RESET),
    ("ignore: we generated and are higher", dict(included=False, my_key=D, proposer=C,
                                                 generated_target=2), PPDecision.IGNORE),
    ("ignore: a higher proposer seen", dict(included=False, seen_max=D), PPDecision.IGNORE),
    ("ignore: stale (older view)", dict(included=False, target=1, my_pvn=3), PPDecision.IGNORE),
])
def test_propose_primary_rules(case, kw, expected):
    assert decide(**kw) is expected, case


keys_ = st.builds(Key, st.integers(1, 6), st.integers(1, 3))


@given(me=keys_, p=keys_, acked=st.none() | keys_, seen=st.none() | keys_,
       my_pvn=st.integers(1, 3), target=st.integers(1, 5), included=st.booleans(),
       generated=st.none() | st.integers(1, 5), by_proposal=st.booleans())
def test_rules_never_let_a_lower_proposer_win(me, p, acked, seen, my_pvn, target, included,
                                              generated, by_proposal):
    d = decide_propose_primary(target=target, my_pvn=my_pvn, my_key=me, proposer=p,
                               included=included, generated_target=generated, acked=acked,
                               seen_max=seen, accepted_by_proposal=by_proposal)
    if d is PPDecision.ACCEPT:
        assert included and (acked is None or acked <= p) and generated != target
    if d is PPDecision.RESET:
        assert not included and not (generated == target and me > p)
        assert seen is None or seen <= p
    if target < my_pvn:
        assert d is PPDecision.IGNORE


def test_proposal_excludes_old_primary_and_lower_precedences():
    # line 4: the rank-3 backup (C) proposing excludes primary A and the slower B
    assert proposal_members([A, B, C, D], A, C) == [C, D]
    assert proposal_members([A, B, C, D], A, B) == [B, C, D]


def test_a_senior_proposal_suppresses_ours():
    assert may_propose(my_key=C, seen_min=None)
    assert not may_propose(my_key=C, seen_min=B)     # B is more senior: let it lead
    assert may_propose(my_key=B, seen_min=C)


# ---- the core on the kernel, no faults ------------------------------------------------

class Group:
    """Replicas of one group on the kernel; phase 2 completes at once."""

    def __init__(self, seed=1, cfg=CFG, state=None):
        self.sim = Sim(seed, NetConfig())
        self.cfg = cfg
        self.actions: dict[int, list] = {}
        self.state = state

    def add(self, node, at_us=None, restart=False):
        def go(sim):
            core = Membership(self.cfg, random.Random(node * 7919 + sim.now_us),
                              self.state() if self.state else None)
            take = core.take_actions

            def recorded(take=take):            # the kernel performs sends; log them too
                acts = take()
                self.actions.setdefault(node, []).extend(
                    (sim.now_us, a) for a in acts if isinstance(a, Send))
                return acts
            core.take_actions = recorded
            core.start(sim.now_us)
            if restart:
                sim.restart(node, core)
            else:
                sim.add_node(node, core, [G], on_action=self.on_action)
        self.sim.at(self.sim.now_us if at_us is None else at_us, go)

    def on_action(self, node, action, now_us):
        self.actions.setdefault(node, []).append((now_us, action))
        if isinstance(action, BeginPhase2):
            core = self.sim.core(node)
            core.phase2_complete(action.pvn, now_us)
            self.sim.at(now_us, lambda s: None, node_id=node)   # pump the new actions

    def core(self, node) -> Membership:
        return self.sim.core(node)

    def run(self, ms):
        self.sim.run_for(ms * 1000)

    def of(self, node, kind):
        return [(t, a) for t, a in self.actions.get(node, []) if isinstance(a, kind)]


def formed(n=3, seed=1, **kw) -> Group:
    g = Group(seed, **kw)
    for i in range(n):
        g.add(i, at_us=0 if i == 0 else 150_000 + i * 1_000)
    g.run(400)
    return g


def test_first_replica_founds_and_later_ones_join_in_order_of_precedence():
    g = formed(3)
    p = g.core(0)
    assert p.status is Status.PRIMARY and p.rank == 1 and p.pvn == 1
    assert [k.precedence for k in p.members] == [1, 2, 3]
    for i, rank in ((1, 2), (2, 3)):
        c = g.core(i)
        assert c.status is Status.BACKUP and c.rank == rank
        assert (c.pvn, c.change, c.members) == (p.pvn, p.change, p.members)
    # the founder announced the view and phase 2 ran
    assert g.of(0, ViewStarted)


def test_state_is_chunked_acknowledged_and_restored():
    restored = []

    class Blob:
        def checkpoint(self):
            return bytes(range(256)) * 300          # 76,800 bytes: 19 chunks of 4 KiB

        def restore(self, data):
            restored.append(data)

    cfg = Config(group=G, state_chunk_bytes=4096, state_window_chunks=4)
    g = formed(2, cfg=cfg, state=Blob)
    assert restored == [bytes(range(256)) * 300]
    states = [a for t, a in g.actions[0] if isinstance(a, Send) and a.msg.type is MsgType.STATE]
    assert {a.msg.body["chunks"] for a in states} == {19}
    assert g.of(1, StateRestored)[0][1].nbytes == 76_800


def test_primary_crash_rank2_takes_over_after_its_timeout_and_ranks_are_recomputed():
    g = formed(3)
    old = g.core(0).key
    t_crash = g.sim.now_us
    g.sim.crash(0)
    g.run(200)
    new = g.core(1)
    assert new.status is Status.PRIMARY and new.pvn == 2
    assert old not in new.members and new.rank == 1 and g.core(2).rank == 2
    (t_prop, _), = [(t, a) for t, a in g.actions[1]
                    if isinstance(a, Send) and a.msg.type is MsgType.PROPOSE_PRIMARY][:1]
    # detected base after the last heartbeat arrived: between base - one heartbeat
    # interval and base + one network delay after the crash
    delay = NetConfig().delay_us_max
    assert CFG.timeout_base_us - CFG.heartbeat_interval_us <= t_prop - t_crash <= CFG.timeout_base_us + delay
    assert g.of(1, ViewStarted)[-1][1].pvn == 2


def test_rank3_takes_over_when_rank2_is_dead_too_and_excludes_it():
    g = formed(3)
    t_crash = g.sim.now_us
    g.sim.crash(0)
    g.sim.crash(1)
    g.run(300)
    c = g.core(2)
    assert c.status is Status.PRIMARY and [k.precedence for k in c.members] == [3]
    t_prop = next(t for t, a in g.actions[2]
                  if isinstance(a, Send) and a.msg.type is MsgType.PROPOSE_PRIMARY)
    assert t_prop - t_crash >= CFG.fault_timeout_us(3) - CFG.heartbeat_interval_us


def test_competing_proposals_are_resolved_in_favour_of_higher_precedence():
    # rank 2 (precedence 2) is cut off and proposes; rank 3 (precedence 3) does not hear
    # it and proposes too, excluding it; after the heal precedence 3 leads, 2 rejoins
    cfg = Config(group=G, ack_timeout_us=400_000)        # keep rank 2 waiting in phase 1
    g = formed(4, cfg=cfg)
    old = g.core(1).birth
    g.sim.crash(0)
    g.sim.partition([1], [2, 3])
    g.run(cfg.fault_timeout_us(3) // 1000 + 10)
    assert g.core(1).status is Status.PROPOSING
    assert g.core(2).status is Status.PRIMARY and g.core(2).pvn == 2
    g.sim.heal()
    g.run(300)
    assert g.core(2).status is Status.PRIMARY
    assert g.core(1).birth != old and g.core(1).status is Status.BACKUP
    assert g.core(1).precedence > 4 and g.core(1).birth in {k.birth for k in g.core(2).members}
    assert any("competing" in a.reason or "excluded" in a.reason for _, a in g.of(1, Reset))


def test_two_replicas_fail_over_without_waiting_for_acknowledgments():
    g = formed(2)
    g.sim.crash(0)
    g.run(100)
    c = g.core(1)
    assert c.status is Status.PRIMARY and len(c.members) == 1


def test_precedence_is_never_reused_and_a_new_primary_continues_above_it():
    g = formed(3)
    g.sim.crash(2)                        # the highest precedence (3) leaves
    g.run(200)
    assert [k.precedence for k in g.core(0).members] == [1, 2]
    assert g.core(0).max_precedence == 3
    g.sim.crash(0)                        # rank 2 becomes primary, alone
    g.run(200)
    assert g.core(1).status is Status.PRIMARY and g.core(1).max_precedence == 3
    g.add(2, restart=True)                # a restarted replica is a new member
    g.run(300)
    assert [k.precedence for k in g.core(1).members] == [2, 4]


def test_a_new_primary_cut_off_during_an_admission_still_never_reuses_a_precedence():
    # seed 11000988: rank 2 is cut off, the primary admits precedence 4 meanwhile; rank 2
    # then proposes knowing only 3; the acknowledging backup knows 4 and says so
    g = formed(3)
    g.sim.partition([0, 2, 3], [1])
    g.add(3)
    g.run(CFG.timeout_base_us // 1000 + 3)
    assert [k.precedence for k in g.core(0).members][-1] == 4
    assert g.core(1).status is Status.PROPOSING and g.core(1).max_precedence == 3
    g.sim.heal()
    g.run(400)
    p = g.core(1)
    assert p.status is Status.PRIMARY and p.max_precedence >= 4
    precs = [k.precedence for k in p.members]
    assert len(set(precs)) == len(precs) and all(x > 4 for x in precs[2:])


def test_silent_backup_is_removed_and_a_wrongly_removed_one_rejoins_with_a_new_birth_id():
    g = formed(3)
    victim = g.core(2)
    old_birth = victim.birth
    g.sim.partition([0, 1], [2])
    # heal after the primary removed it (50 ms) but before its own rank-3 detector
    # (75 ms) would make it propose itself
    g.run(CFG.backup_timeout_us // 1000 + 10)
    assert CFG.backup_timeout_us + 10_000 < CFG.fault_timeout_us(3)
    assert old_birth not in {k.birth for k in g.core(0).members}
    g.sim.heal()
    g.run(400)
    resets = [a for _, a in g.of(2, Reset)]
    assert resets and resets[0].old_birth == old_birth and resets[0].new_birth != old_birth
    assert g.core(2).status is Status.BACKUP and g.core(2).birth in {k.birth for k in g.core(0).members}
    assert g.core(2).precedence > 3


def test_a_proposal_by_a_removed_backup_neither_resets_the_primary_nor_takes_its_backup():
    # the rank-2 backup is cut off alone: its detector fires (25 ms) and, with no remote
    # group to ask, it proposes itself and the rank-3 backup, which cannot hear it; the
    # primary removes it (50 ms). Its ProposePrimary, retransmitted across the heal, comes
    # from a membership the group left: the primary neither resets by it (the paper's
    # line 25) nor does the other backup follow it; the primary tells the proposer its
    # membership, and it rejoins.
    g = formed(3)
    primary, cut, backup = (g.core(i).birth for i in range(3))
    g.sim.partition([0, 2], [1])
    g.run(CFG.backup_timeout_us // 1000 + 10)
    assert CFG.backup_timeout_us + 10_000 < CFG.fault_timeout_us(2) + CFG.ack_timeout_us
    assert cut not in {k.birth for k in g.core(0).members}
    assert g.core(1).status is Status.PROPOSING
    g.sim.heal()
    g.run(400)
    assert g.core(0).status is Status.PRIMARY and g.core(0).birth == primary
    assert g.core(2).status is Status.BACKUP and g.core(2).birth == backup
    assert not g.of(0, Reset) and not g.of(2, Reset)
    resets = [a for _, a in g.of(1, Reset)]
    assert resets and resets[0].old_birth == cut and "without us" in resets[0].reason
    assert g.core(1).status is Status.BACKUP
    assert {k.birth for k in g.core(0).members} == {g.core(i).birth for i in range(3)}


def test_after_a_partition_heals_the_branch_with_the_lower_primary_is_pruned():
    g = formed(3)
    g.sim.partition([0], [1, 2])          # 1 takes over on its side
    g.run(300)
    assert g.core(0).status is Status.PRIMARY and g.core(1).status is Status.PRIMARY
    old0 = g.core(0).birth
    g.sim.heal()
    g.run(500)
    p = g.core(1)
    assert p.status is Status.PRIMARY and g.core(0).status is Status.BACKUP
    assert g.core(0).birth != old0                               # it reset and rejoined
    assert {k.birth for k in p.members} == {g.core(i).birth for i in range(3)}
    reset = g.of(0, Reset)[0][1]
    assert "competing primary" in reset.reason


def test_awaiting_state_backup_resets_when_the_primary_fails():
    class Slow:
        def checkpoint(self):
            return b"x" * 100

        def restore(self, data):
            pass
    g = Group(cfg=CFG)
    g.add(0, at_us=0)
    g.run(200)
    core = Membership(CFG, random.Random(5))
    core.start(g.sim.now_us)
    # accept it into the membership by hand, then let the primary vanish
    p = g.core(0)
    g.sim.crash(0)
    msg = Message(MsgType.ACCEPT_BACKUP, G, G, 0, Role.CLIENT, p.pvn, p.precedence, p.birth,
                  body={"members": [[p.birth, 1], [core.birth, 2]], "old_members": [[p.birth, 1]],
                        "change": 1, "max_precedence": 2, "lineage": 0})
    core.handle_message(msg, g.sim.now_us)
    assert core.status is Status.AWAITING_STATE
    old = core.birth
    t = core.next_timer_us()
    while core.status is Status.AWAITING_STATE:
        core.handle_timer(t)
        t = core.next_timer_us()
    assert core.status is Status.JOINING and core.birth != old
    assert any(isinstance(a, Reset) for a in core.take_actions())


# ---- crafted messages ------------------------------------------------------------------

def member(birth=111, prec=3, pvn=4, members=((100, 1), (105, 2), (111, 3), (120, 4))):
    """A backup core placed directly into a membership."""
    core = Membership(CFG, random.Random(1))
    core.start(0)
    core.birth = birth
    core.status = Status.BACKUP
    core._install(pvn, 0, [Key(p, b) for b, p in members], max(p for _, p in members), 0)
    core.take_actions()
    return core


def pp(sender, prec, members, old_pvn=4, change=0, old_primary=100, evidenced=0):
    return Message(MsgType.PROPOSE_PRIMARY, G, G, 0, Role.CLIENT, old_pvn, prec, sender,
                   body={"members": [list(m) for m in members], "old_pvn": old_pvn,
                         "old_primary": old_primary, "change": change, "max_precedence": 9,
                         "evidenced": evidenced})


def test_core_accepts_acknowledges_and_adopts_the_proposed_ranks():
    c = member()
    c.handle_message(pp(105, 2, [(105, 2), (111, 3), (120, 4)]), 10)
    acts = c.take_actions()
    assert c.pvn == 5 and c.rank == 2 and c.primary == Key(2, 105)
    assert any(isinstance(a, Send) and a.msg.type is MsgType.PROPOSE_PRIMARY_ACK
               and a.msg.body == {"proposer": 105, "change": 0, "max_precedence": 9}
               for a in acts)
    assert any(isinstance(a, MembershipChanged) and a.my_rank == 2 for a in acts)
    # a competing higher proposer for the same view wins over the acked lower one...
    c.handle_message(pp(120, 4, [(120, 4)]), 11)
    # ...but it excludes us (precedence 3 < 4): we reset and rejoin
    assert c.status is Status.JOINING


def test_core_resets_when_excluded_and_ignores_stale_proposals():
    c = member()
    c.handle_message(pp(120, 4, [(120, 4)], old_pvn=2), 10)          # stale view
    assert c.status is Status.BACKUP
    c.handle_message(pp(120, 4, [(120, 4)]), 10)                     # excluded from v+1
    assert c.status is Status.JOINING
    assert any(isinstance(a, Reset) for a in c.take_actions())


@pytest.mark.parametrize("served, evidenced, reset", [
    (False, 0, True),       # the paper: excluded, it resets
    (True, 1, True),        # the remote groups said it is silent there too
    (True, 0, False),       # served, and the proposer asked nobody: it stays
])
def test_a_serving_primary_is_not_reset_by_a_proposer_that_asked_nobody(served, evidenced,
                                                                        reset):
    """A proposer that knew no remote group proposed on its own detector (the paper),
    but it may only have been cut off before the primary's connections reached it: a
    primary that serves remote groups stays (the served branch outranks the unserved one
    once that forms). tests/sim/regressions/
    replica_unevidenced_proposal_excludes_a_serving_primary."""
    c = member(birth=100, prec=1)
    c.status = Status.PRIMARY
    c.served_of = lambda: served
    c.handle_message(pp(105, 2, [(105, 2), (111, 3)], old_primary=100,
                        evidenced=evidenced), 10)
    assert (c.status is Status.JOINING) is reset
    assert c.unevidenced_exclusions == (0 if reset else 1)


def test_once_a_view_is_entered_a_competing_proposal_for_it_is_ignored():
    c = member(birth=130, prec=5, members=((100, 1), (105, 2), (120, 4), (130, 5)))
    c.handle_message(pp(105, 2, [(105, 2), (120, 4), (130, 5)]), 10)
    hb = Message(MsgType.HEARTBEAT, G, G, 0, Role.CLIENT, 5, 2, 105, body={"rank": 1, "served": 0, "lineage": 0, "change": 0, "wait": 0, "replay": 0, "rm": 0, "done": 0})
    c.handle_message(hb, 11)                                        # the view formed
    c.handle_message(pp(120, 4, [(120, 4), (130, 5)]), 12)
    assert c.primary == Key(2, 105)


def test_a_proposal_from_another_branch_is_not_judged_by_our_view():
    # seed 11000407: the primary of a singleton view 2 accepted a proposal for view 3
    # that replaced a *different* view 2, switching branches without a reset
    c = member()                                                    # view 4 of (1, 100)
    c.handle_message(pp(105, 2, [(105, 2), (111, 3)], old_pvn=4, old_primary=77), 10)
    assert c.pvn == 4 and c.status is Status.BACKUP                 # other parent: ignored
    c.handle_message(pp(105, 2, [(105, 2)], old_pvn=4, old_primary=77), 11)
    assert c.status is Status.BACKUP                                # not even a reset
    c.handle_message(pp(105, 2, [(105, 2), (111, 3)], old_pvn=4, old_primary=100), 12)
    assert c.pvn == 5 and c.primary == Key(2, 105)                  # our view's successor


def test_competing_primary_heartbeat_prunes_lower_branch_and_is_remulticast():
    c = member()
    higher = Message(MsgType.HEARTBEAT, G, G, 0, Role.CLIENT, 2, 7, 999, body={"rank": 1, "served": 0, "lineage": 0, "change": 0, "wait": 0, "replay": 0, "rm": 0, "done": 0})
    lower = Message(MsgType.HEARTBEAT, G, G, 0, Role.CLIENT, 9, 1, 5, body={"rank": 1, "served": 0, "lineage": 0, "change": 0, "wait": 0, "replay": 0, "rm": 0, "done": 0})
    c.handle_message(lower, 5)             # key (1, 5) < our primary's (1, 100): ignored
    assert c.status is Status.BACKUP
    c.handle_message(higher, 6)
    acts = c.take_actions()
    assert c.status is Status.JOINING
    assert any(isinstance(a, Send) and a.msg is higher for a in acts)


def test_malformed_membership_is_counted_and_dropped():
    c = member()
    bad = pp(105, 2, [(111, 3), (105, 2)])                 # not in precedence order
    c.handle_message(bad, 10)
    assert c.rejected == 1 and c.pvn == 4
    c.handle_message(pp(105, 2, [(105, 2), (105, 3)]), 10)  # duplicate birth
    assert c.rejected == 2


def test_primary_bounds_pending_joiners():
    g = formed(1)
    p = g.core(0)
    for b in range(1, 40):
        msg = Message(MsgType.PROPOSE_BACKUP, G, G, 0, Role.CLIENT, 0, 0, 10_000 + b,
                      body={"host": "h", "pid": b})
        p.status = Status.PRIMARY_PHASE2         # queue without admitting
        p.handle_message(msg, g.sim.now_us)
    assert len(p._joiners) <= MAX_PENDING_JOINERS
    assert MAX_PENDING_JOINERS < MAX_MEMBERS


# ---- simulation ------------------------------------------------------------------------

def test_sim_schedules_hold_every_check():
    bad = dict(simcheck.CAMPAIGN.failures(200, 7))
    assert not bad


@pytest.mark.slow
def test_sim_campaign(soak):
    n = {"small": 250, "full": 20_000}[soak]
    bad = [s for s, _ in simcheck.CAMPAIGN.failures(n, 23)]
    assert not bad, bad[:10]


def change_msg(mtype, members, change, sender=100, prec=1, pvn=4):
    return Message(mtype, G, G, 0, Role.CLIENT, pvn, prec, sender,
                   body={"members": [list(m) for m in members], "old_members": [],
                         "change": change, "max_precedence": 9, "lineage": 0})


def test_backup_accepts_a_new_membership_and_recomputes_its_rank():
    c = member()                                   # rank 3 of (1,100) (2,105) (3,111) (4,120)
    c.handle_message(change_msg(MsgType.REMOVE_BACKUP, [(100, 1), (111, 3), (120, 4)], 1), 10)
    acts = c.take_actions()
    assert c.rank == 2 and c.change == 1
    assert any(isinstance(a, Send) and a.msg.type is MsgType.REMOVE_BACKUP_ACK
               and a.msg.body == {"change": 1} for a in acts)
    c.handle_message(change_msg(MsgType.ACCEPT_BACKUP,
                                [(100, 1), (111, 3), (120, 4), (130, 10)], 2), 11)
    assert c.rank == 2 and c.change == 2 and c.max_precedence == 10
    # a duplicate of an older change is acknowledged again, not applied
    c.take_actions()
    c.handle_message(change_msg(MsgType.REMOVE_BACKUP, [(100, 1), (111, 3), (120, 4)], 1), 12)
    assert c.change == 2 and any(a.msg.body == {"change": 1} for a in c.take_actions()
                                 if isinstance(a, Send))


def test_backup_removed_from_the_membership_resets_and_applies_under_a_new_birth_id():
    c = member()
    c.handle_message(change_msg(MsgType.REMOVE_BACKUP, [(100, 1), (105, 2), (120, 4)], 1), 10)
    acts = c.take_actions()
    reset = next(a for a in acts if isinstance(a, Reset))
    assert reset.old_birth == 111 and c.birth == reset.new_birth != 111
    pb = [a.msg for a in acts if isinstance(a, Send) and a.msg.type is MsgType.PROPOSE_BACKUP]
    assert pb and pb[0].sender == c.birth and pb[0].precedence == 0


def test_membership_from_a_lower_foreign_primary_is_ignored():
    c = member()
    c.handle_message(change_msg(MsgType.REMOVE_BACKUP, [(50, 1), (60, 2)], 7, sender=50), 10)
    assert c.status is Status.BACKUP and c.change == 0


def test_view_entered_stops_competing_proposals_for_that_view():
    c = member(birth=130, prec=5, members=((100, 1), (105, 2), (120, 4), (130, 5)))
    c.handle_message(pp(105, 2, [(105, 2), (120, 4), (130, 5)]), 10)
    c.view_entered(5, 11)                       # the runtime reached the view's order info
    c.handle_message(pp(120, 4, [(120, 4), (130, 5)]), 12)
    assert c.primary == Key(2, 105)


def test_a_proposer_ignores_new_versions_of_the_proposal_it_denounced():
    # seed 17005015: after acking 105's proposal for view 5, replica 111 times 105 out
    # and proposes view 6; a later version of 105's view-5 proposal must not pull it back
    c = member()
    c.handle_message(pp(105, 2, [(105, 2), (111, 3), (120, 4)]), 10)
    assert c.pvn == 5 and c.rank == 2
    c.handle_timer(10 + CFG.fault_timeout_us(2))
    assert c.status is Status.PROPOSING
    c.handle_message(pp(105, 2, [(105, 2), (111, 3)], change=1), 20 + CFG.fault_timeout_us(2))
    assert c.status is Status.PROPOSING and c.pvn == 5 and c.primary == Key(2, 105)
    c.handle_message(pp(105, 2, [(105, 2)], change=2), 30 + CFG.fault_timeout_us(2))
    assert c.status is Status.PROPOSING                 # not a reset either


def test_a_proposer_denounced_in_turn_resets():
    # 111 proposes view 5; 120 (higher) times 111 out and proposes view 6 without it
    c = member()
    c.handle_timer(CFG.fault_timeout_us(3))              # rank 3: 105 and 100 both slow
    assert c.status is Status.PROPOSING and c._proposal.target == 5
    c.handle_message(pp(120, 4, [(120, 4)], old_pvn=5, old_primary=111), 1 + CFG.fault_timeout_us(3))
    assert c.status is Status.JOINING


def test_cli_last_line_and_exit_code(monkeypatch, capsys):
    from llft import cli
    assert cli.main(["simulate", "membership", "--schedules", "3", "--seed", "11"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "3 schedules, 0 violations"
    verdicts = iter([["x"], [], ["x"], []])          # every other schedule fails
    monkeypatch.setattr(simcheck.CAMPAIGN, "run_seed",
                        lambda seed, **kw: Outcome(next(verdicts), Script("membership")))
    assert cli.main(["simulate", "membership", "--schedules", "4", "--seed", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "4 schedules, 2 violations"
    assert sum(line.startswith("seed ") for line in out) == 2
