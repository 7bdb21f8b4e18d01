"""Takeover needs evidence (membership/core.py `_awaiting_evidence`), and a served branch
outranks an unserved one on a heal (membership/rules.py `competing_primary_wins`).

A backup cut off alone cannot tell that from its primary's crash; before these rules it
took over a branch of its own that won on the heal and rolled back replies the clients
had (tests/sim/regressions/replica_partition_stale_branch_wins.scenario). The cores are
driven directly with crafted messages, at the times they ask for.
"""
from __future__ import annotations

import random

from llft.protocol.messages import Message, MsgType, Role
from llft.protocol.messaging import MessagingEndpoint
from membership.core import Config, Membership, Send, Status
from membership.rules import Key, competing_primary_wins, describe_lineage, lineage_of

G, R = "g", "clients"
CFG = Config(group=G)
HB, BASE, MS = CFG.heartbeat_interval_us, CFG.timeout_base_us, 1_000
PRIMARY, ME = 100, 105


def backup(remote_groups=(R,)) -> Membership:
    core = Membership(CFG, random.Random(1))
    core.start(0)
    core.birth = ME
    core.status = Status.BACKUP
    core._install(4, 0, [Key(1, PRIMARY), Key(2, ME)], 2, 0)
    core.remote_groups_of = lambda: remote_groups
    core.take_actions()
    return core


def sent(core: Membership, mtype: MsgType) -> list[Send]:
    return [a for a in core.take_actions() if isinstance(a, Send) and a.msg.type is mtype]


def advance(core: Membership, until_us: int) -> int:
    """Run the timer whenever it asks, up to `until_us` (no local stall)."""
    now = core.next_timer_us()
    while now <= until_us:
        core.handle_timer(now)
        now = core.next_timer_us()
    return until_us


def heartbeat(sender: int, pvn: int, rank: int = 1, change: int = 0, rm: int = 0) -> Message:
    """A HEARTBEAT of `sender` (a member of rank `rank`) in view `pvn`."""
    return Message(MsgType.HEARTBEAT, G, G, 0, Role.CLIENT, pvn, rank, sender,
                   body={"rank": rank, "served": 1, "lineage": 0, "change": change,
                         "wait": 0, "replay": 0, "rm": rm, "done": 0})


def fire_detector(core: Membership) -> int:
    """Run the timer (no word from the primary) until the detector has fired."""
    while not core.takeover_held and core.status is Status.BACKUP:
        core.handle_timer(core.next_timer_us())
    return core.next_timer_us()


def test_with_no_remote_connection_the_detector_proposes_at_once():
    core = backup(remote_groups=())
    fire_detector(core)
    assert core.status is Status.PRIMARY_PHASE2 and core.takeovers_held == 0


def test_a_backup_with_clients_probes_them_and_waits_for_their_word():
    core = backup()
    now = fire_detector(core)
    assert core.status is Status.BACKUP and core.takeover_held
    probes = sent(core, MsgType.PROBE)
    assert [(a.dst_group, a.msg.type, a.msg.body["answer"]) for a in probes] == [
        (R, MsgType.PROBE, 0)]
    # nobody answers (cut off alone): it probes again every retransmit interval and never
    # proposes, however long the silence
    advance(core, now + 200 * CFG.retransmit_us)
    types = [a.msg.type for a in core.take_actions() if isinstance(a, Send)]
    assert types.count(MsgType.PROBE) >= 199 and MsgType.PROPOSE_PRIMARY not in types
    assert core.status is Status.BACKUP and core.takeover_held


def test_an_answer_that_the_primary_is_silent_there_too_lets_it_take_over():
    core = backup()
    now = fire_detector(core)
    heard = core._last_heard[PRIMARY]
    core.probe_answered(PRIMARY, 4, now - heard, now)        # last heard when we did
    assert core.status is Status.PRIMARY_PHASE2      # alone: phase 1 is done at once
    assert sent(core, MsgType.PROPOSE_PRIMARY)


def test_an_answer_that_the_primary_spoke_to_them_since_keeps_it_waiting():
    core = backup()
    now = fire_detector(core)
    # it spoke to them 1 ms ago, a whole detector timeout after it fell silent to us
    # (30 ms > 25): we were cut off while it served them
    core.probe_answered(PRIMARY, 4, 1 * MS, now)
    assert core.status is Status.BACKUP and core.probes_alive == 1
    # even once it is silent there as well, never take over (answers count no more)
    heard = core._last_heard[PRIMARY]
    later = advance(core, now + 10 * BASE)
    core.probe_answered(PRIMARY, 4, later - (heard + 2 * BASE), later)
    assert core.status is Status.BACKUP and core.probes_alive == 1
    # ... nor on the word of a member that never heard it (one restarted since: true,
    # and our state is still stale; replica_removed_backup_outranks_the_state)
    core.probe_answered(0, 0, 2 * BASE, later + 1)
    assert core.status is Status.BACKUP
    # until it speaks to us again: then a later silence is judged afresh
    core.handle_message(heartbeat(PRIMARY, 4), later + 2)
    now = fire_detector(core)
    core.probe_answered(0, 0, 2 * BASE, now)
    assert core.status is Status.PRIMARY_PHASE2


def _served_after(rm_ms: int | None, after_ms: int) -> Membership:
    """A backup whose primary said `rm_ms` (None: nothing) and then fell silent; the
    clients answer that it served them `after_ms` after that."""
    core = backup()
    if rm_ms is not None:
        core.handle_message(heartbeat(PRIMARY, 4, rm=rm_ms), 1)
    now = fire_detector(core)
    heard = core._last_heard[PRIMARY]
    core.probe_answered(PRIMARY, 4, now - heard - after_ms * MS, now)
    return core


def test_serving_them_longer_after_than_the_primary_removes_a_backup_is_our_removal():
    """The primary's HEARTBEAT says how soon it removes a silent backup (`rm`). Serving
    the clients longer than that (less two heartbeats) after it fell silent to us, it may
    have removed us and served what we do not hold: never take over from it. Before, a
    backup judged by its own timeout on the primary as extended (up to 100 ms), and took
    over with a stale state where the primary had removed it after 50 ms (replica_behind_
    backup_takes_over_after_a_short_heal in other timing)."""
    assert _served_after(30, 22)._outlived_by == PRIMARY     # 22 > 30 - 2 x 5
    assert _served_after(200, 22)._outlived_by is None       # within 25 ms + extension
    # not said (a primary just heard, or of another view): the floor of any removal
    assert _served_after(None, 22)._outlived_by is None      # 22 < 50 - 10
    assert _served_after(None, 42)._outlived_by == PRIMARY


def test_a_primary_says_how_soon_it_removes_a_backup():
    core = backup()
    assert core.removal_wait_ms() == 0                        # a backup says nothing
    core.status = Status.PRIMARY
    core._install(5, 0, [Key(2, ME), Key(3, 106)], 3, 10)
    assert core.removal_wait_ms() == CFG.backup_timeout_us // MS   # the floor, no history
    core._install(5, 1, [Key(2, ME)], 3, 20)
    assert core.removal_wait_ms() == 0                        # alone: nobody to remove


def test_a_member_that_began_to_listen_after_our_primary_fell_silent_says_nothing_of_our_view():
    """A primary of an EARLIER view of ours speaking to them means our view may be a
    branch that went nowhere (we wait) -- unless the answerer began to listen after our
    primary fell silent to us: it could not have heard our view either way. A member
    restarted since answered so about a primary cut off alone through our whole view,
    which still spoke after the heal, and the backup holding our view's state waited for
    ever (tests/sim/regressions/replica_fresh_answer_names_an_older_primary)."""
    core = backup()
    now = fire_detector(core)
    silent_for = now - core._last_heard[PRIMARY]
    core.probe_answered(999, 3, 0, now, listen_us=silent_for - 1)     # fresh: nothing
    assert core.probes_alive == 0 and core.status is Status.BACKUP
    core.probe_answered(PRIMARY, 4, silent_for, now + 1)     # ours silent there too
    assert core.status is Status.PRIMARY_PHASE2
    core = backup()
    now = fire_detector(core)
    silent_for = now - core._last_heard[PRIMARY]
    core.probe_answered(999, 3, 0, now, listen_us=silent_for + 1)     # it would have heard
    assert core.probes_alive == 1
    core.probe_answered(PRIMARY, 4, silent_for, now + 1)
    assert core.status is Status.BACKUP


def test_an_answer_that_another_primary_of_ours_serves_them_keeps_it_waiting():
    core = backup()
    now = fire_detector(core)
    core.probe_answered(999, 5, 0, now)          # a later view of our group: not ours
    assert core.status is Status.BACKUP and core.probes_alive == 1


def test_an_answer_from_a_member_that_never_heard_our_primary_counts_once_it_listened():
    core = backup()
    now = fire_detector(core)
    core.probe_answered(0, 0, BASE // 2, now)                # just started listening
    assert core.status is Status.BACKUP
    core.probe_answered(0, 0, 2 * BASE, now + 1)             # listened long enough
    assert core.status is Status.PRIMARY_PHASE2      # alone: phase 1 is done at once


def test_the_primary_heard_again_ends_the_hold():
    core = backup()
    fire_detector(core)
    now = core.next_timer_us()
    core.handle_message(heartbeat(PRIMARY, 4), now)
    assert not core.takeover_held and core._primary_served


def test_every_member_of_a_remote_group_answers_with_what_it_heard_of_our_primary():
    ep = MessagingEndpoint(R, 7)
    keepalive = Message(MsgType.KEEP_ALIVE, G, R, 1, Role.SERVER, 4, 1, PRIMARY, ts=1)
    ep.handle_message(keepalive, 1_000)
    ep.take_actions()
    probe = Message(MsgType.PROBE, G, R, 0, Role.CLIENT, 4, 2, ME,
                    body={"answer": 0, "pvn": 0, "primary": 0, "ago": 0, "quiet": 0, "size": 0, "listen": 0})
    ep.handle_message(probe, 31_000)
    assert ep.next_timer_us() == 31_000               # answered from a timer, due at once
    ep.handle_timer(31_000)
    (a,) = [a for a in ep.take_actions() if getattr(a, "msg", None) is not None
            and a.msg.type is MsgType.PROBE]
    assert a.dst_group == G and a.msg.body == {"answer": 1, "pvn": 4, "primary": PRIMARY,
                                               "ago": 30_000, "quiet": 0, "size": 0,
                                               "listen": 30_000}
    ep.handle_message(probe, 31_100)                  # rate-limited: one per nack delay
    ep.handle_timer(31_100)
    assert not [a for a in ep.take_actions() if getattr(a, "msg", None) is not None
                and a.msg.type is MsgType.PROBE]
    # a PROBE that came (queued) while we were stopped is handled at its arrival time,
    # but its answer says how long ago we heard their primary when it goes (the timer
    # runs at the clock's now): not as of the arrival, which would pass our stall off
    # as their primary's word (replica_paused_member_stamps_queued_words_as_fresh)
    ep.handle_message(probe, 33_000)
    ep.handle_timer(60_000)
    (a,) = [a for a in ep.take_actions() if getattr(a, "msg", None) is not None
            and a.msg.type is MsgType.PROBE]
    assert a.msg.body["ago"] == 59_000 and a.msg.body["listen"] == 59_000
    answer = Message(MsgType.PROBE, G, R, 0, Role.CLIENT, 4, 2, ME,
                     body={"answer": 1, "pvn": 0, "primary": 0, "ago": 0, "quiet": 0, "size": 0, "listen": 0})
    ep.handle_message(answer, 40_000)                 # an answer is not answered
    assert not [a for a in ep.take_actions() if getattr(a, "msg", None) is not None
                and a.msg.type is MsgType.PROBE]


def test_a_served_branch_outranks_an_unserved_one_whatever_the_precedence():
    low, high = Key(1, 10), Key(7, 20)
    assert competing_primary_wins(mine=low, theirs=high)                  # the paper
    assert not competing_primary_wins(mine=low, theirs=high, mine_served=True,
                                      theirs_served=False)
    assert competing_primary_wins(mine=high, theirs=low, mine_served=False,
                                  theirs_served=True)
    assert competing_primary_wins(mine=low, theirs=high, mine_served=True,
                                  theirs_served=True)                     # both: precedence
    # a message that does not say (not a HEARTBEAT): a served branch waits for one
    assert not competing_primary_wins(mine=low, theirs=high, mine_served=True)
    assert competing_primary_wins(mine=low, theirs=high, mine_served=False)


def _request(msn: int, offset: int, data: bytes) -> Message:
    """The clients' primary's data on their connection 5 to our group G."""
    return Message(MsgType.REQUEST, R, G, 5, Role.CLIENT, 1, 1, 900, msn=msn,
                   body={"offset": offset, "data": data, "flags": 0})


def test_a_connection_heard_from_its_middle_does_not_make_a_branch_served():
    """A backup that took over alone with no connection hears, after the heal, the
    clients of the branch that served them, from the middle of their stream: it cannot
    deliver any of it, and that does not make its branch "served" (it would then win the
    heal on precedence: replica_heal_foreign_connection_served). A connection heard from
    its start, or whose stream reaches it here in order, does."""
    ep = MessagingEndpoint(G, ME)
    ep.set_view(2, ME, [(ME, 2)], ME, 0)
    assert not ep.served
    ep.handle_message(_request(4, 1962, b"x" * 100), 1_000)
    assert not ep.served
    ep.handle_message(_npv(), 1_500)       # taken up (a remote new primary's question)
    assert (R, 5, Role.SERVER) in ep.conns and not ep.served
    ep.handle_message(_request(4, 1962, b"x" * 100), 1_600)
    assert not ep.served
    ep = MessagingEndpoint(G, ME)
    ep.set_view(2, ME, [(ME, 2)], ME, 0)
    ep.handle_message(_request(1, 0, b"y" * 1962), 2_000)    # its start, in order here
    assert ep.served
    fresh = MessagingEndpoint(G, ME)
    fresh.set_view(2, ME, [(ME, 2)], ME, 0)
    fresh.handle_message(_request(1, 0, b"y" * 10), 1_000)   # a stream that starts here
    assert fresh.served


def _npv(delivered: int = 0) -> Message:
    """The clients' new primary (view 2) asks our group where their connection 5 stands;
    it delivered `delivered` bytes of ours there."""
    return Message(MsgType.NEW_PRIMARY_VIEW, R, G, 5, Role.CLIENT, 2, 2, 901, msn=1,
                   body={"old_pvn": 1, "last_delivered": delivered})


def test_a_primary_keeps_silent_on_a_connection_it_never_had():
    """A primary that hears a connection it does not know in the middle of its stream
    holds none of it: another branch of its group served it. A word from it there (an
    ack, a NACK for the gap) would make the clients follow its view number, and the
    serving primary's lower one would be stale there once it prunes this branch: the
    stream stalls (replica_cut_backup_view_speaks_on_a_connection_it_never_had). It
    ignores such messages; the stream's start and a remote new primary's
    NEW_PRIMARY_VIEW that delivered nothing of ours there are taken up. A backup takes
    up what it hears, as before."""
    ep = MessagingEndpoint(G, ME)
    ep.set_view(2, ME, [(ME, 2)], ME, 0)
    ep.take_actions()
    for t, msg in enumerate([_request(4, 1962, b"x" * 100), _request(5, 2062, b"z" * 10)]):
        ep.handle_message(msg, 1_000 + t)
    assert not ep.conns and ep.stats["rx_unknown_midstream"] == 2
    assert ep.take_actions() == []
    assert not any(key == (R, 5, Role.SERVER) for _, key in ep.timers.keys())
    ep.handle_message(_npv(delivered=700), 2_000)   # bytes of ours: another branch's
    assert not ep.conns and ep.stats["rx_unknown_midstream"] == 3
    assert ep.take_actions() == []
    ep.handle_message(_npv(), 3_000)
    assert (R, 5, Role.SERVER) in ep.conns
    answer = [a for a in ep.take_actions() if getattr(a, "msg", None) is not None]
    assert [a.msg.type for a in answer] == [MsgType.NEW_PRIMARY_VIEW_ACK]
    start = MessagingEndpoint(G, ME)
    start.set_view(2, ME, [(ME, 2)], ME, 0)
    start.handle_message(_request(1, 0, b"y" * 10), 1_000)
    assert (R, 5, Role.SERVER) in start.conns
    bk = MessagingEndpoint(G, ME)
    bk.set_view(2, PRIMARY, [(PRIMARY, 1), (ME, 2)], ME, 0)
    bk.handle_message(_request(4, 1962, b"x" * 100), 1_000)
    assert (R, 5, Role.SERVER) in bk.conns


def test_the_older_lineage_outranks_a_group_founded_anew():
    # a replica reset while cut off founds the group again at a view above every view it
    # heard of: served and of higher precedence, its branch still yields to the lineage
    old, refounded = Key(1, 10), Key(9, 20)
    assert not competing_primary_wins(mine=old, theirs=refounded, mine_served=False,
                                      theirs_served=True, mine_lineage=1, theirs_lineage=6)
    assert competing_primary_wins(mine=refounded, theirs=old, mine_served=True,
                                  theirs_served=False, mine_lineage=6, theirs_lineage=1)
    # same lineage (or unknown): served, then precedence
    assert competing_primary_wins(mine=old, theirs=refounded, mine_served=True,
                                  theirs_served=True, mine_lineage=1, theirs_lineage=1)
    assert competing_primary_wins(mine=old, theirs=refounded, mine_served=True,
                                  theirs_served=True, mine_lineage=1, theirs_lineage=0)


def test_a_founder_starts_a_lineage_and_a_joiner_takes_its_primarys():
    founder = Membership(CFG, random.Random(3))
    founder.max_seen_pvn = 5                       # it heard of view 5 before its reset
    founder.wall_ms_of = lambda: 1_764_000_000_123          # its wall clock, ms
    founder.start(0)
    while founder.status is Status.JOINING:
        founder.handle_timer(founder.next_timer_us())
    assert founder.pvn == 6 and founder.lineage == lineage_of(6, 1_764_000_000_123)
    joiner = Membership(CFG, random.Random(4))
    joiner.start(0)
    joiner.handle_message(Message(
        MsgType.ACCEPT_BACKUP, G, G, 0, Role.CLIENT, 6, 1, founder.birth,
        body={"members": [[founder.birth, 1], [joiner.birth, 2]], "old_members": [],
              "change": 1, "max_precedence": 2, "lineage": founder.lineage}), 1_000)
    assert joiner.status is Status.AWAITING_STATE and joiner.lineage == founder.lineage


def test_lineages_order_by_founding_view_then_founding_time():
    # a reset replica refounding above the views it heard of: younger, whatever the time
    assert lineage_of(1, 9_000) < lineage_of(2, 5)
    # a replica restarted while cut off founds view 1 too, later: younger
    first, restarted = lineage_of(1, 1_764_000_000_000), lineage_of(1, 1_764_000_004_500)
    assert first < restarted
    assert not competing_primary_wins(mine=Key(1, 10), theirs=Key(1, 99), mine_served=True,
                                      theirs_served=True, mine_lineage=first,
                                      theirs_lineage=restarted)
    assert competing_primary_wins(mine=Key(1, 99), theirs=Key(1, 10), mine_served=True,
                                  theirs_served=True, mine_lineage=restarted,
                                  theirs_lineage=first)
    assert describe_lineage(first) == "v1@1764000000000ms"


def test_a_primary_heard_after_it_removed_us_does_not_make_our_state_current():
    """The primary's heartbeats name its membership change: one that is later than ours
    (it removed us while we were cut off, and the heal let its heartbeat through first)
    refreshes the detector, but our state counts as no newer than the word we had before
    it (`_behind_since_us`), from which a probe's answer is judged."""
    core = backup()
    t0 = advance(core, 10 * MS)
    for t in range(t0, t0 + 5 * HB, HB):           # heard, but of a later membership
        advance(core, t)
        core.handle_message(heartbeat(PRIMARY, 4, change=7), t)
    now = fire_detector(core)
    # the clients heard the primary 3 ms after its last heartbeat reached us: a crash,
    # were we current; but our state is as old as our last current moment
    heard = core._last_heard[PRIMARY]
    core.probe_answered(PRIMARY, 4, now - (heard + 3 * MS), now)
    assert core.status is Status.BACKUP and core.probes_alive == 1


def test_a_primary_whose_heartbeats_came_late_under_load_is_judged_by_its_last_word():
    """Under load a primary's heartbeats come late while its order info still flows (the
    runtime reports every message from it: `primary_spoke`). Its last reply to the clients
    came long after its last heartbeat but right after its last order info: a crash, not
    a cut, so the backup takes over (judged by heartbeats alone it held for ever: the
    rank-3 backup then took over and reset it, tests/processes/test_busy_machine.py)."""
    core = backup()
    now = fire_detector(core)
    heard = core._last_heard[PRIMARY]
    spoke = heard + 2 * BASE                        # order info 50 ms after the heartbeat
    core.primary_spoke(spoke)
    soon = advance(core, spoke + 5 * MS)            # it still speaks: not silent
    core.probe_answered(PRIMARY, 4, soon - spoke, soon)
    assert core.status is Status.BACKUP and core.probes_alive == 1
    later = advance(core, spoke + BASE + 5 * MS)    # then silent to us and to them
    core.probe_answered(PRIMARY, 4, later - (spoke + 1 * MS), later)
    assert core.status is Status.PRIMARY_PHASE2


def _three(remote_groups=(R,)) -> Membership:
    """A backup of a three-member view: PRIMARY, ME, OTHER (a junior backup)."""
    core = Membership(CFG, random.Random(1))
    core.start(0)
    core.birth = ME
    core.status = Status.BACKUP
    core._install(4, 0, [Key(1, PRIMARY), Key(2, ME), Key(3, OTHER)], 3, 0)
    core.remote_groups_of = lambda: remote_groups
    core.take_actions()
    return core


OTHER = 107


def test_a_lost_answer_is_no_evidence_where_a_majority_decides():
    """A machine cut takes one replica of each group: a remote member cut off with us
    (it has not heard a majority of its own three-member group for as long as we have
    not heard our primary) says our primary is silent: true on our side only. Our own
    view has three members and we hear none of them: we hold, until the long hold."""
    core = _three()
    now = fire_detector(core)
    quiet = now - core._last_heard[PRIMARY]          # it lost its group when we did
    core.probe_answered(0, 0, 2 * BASE, now, quiet, 3)
    assert core.status is Status.BACKUP
    core.probe_answered(PRIMARY, 4, quiet, now + 1, quiet, 2)   # a group of two: the same
    assert core.status is Status.BACKUP
    later = advance(core, now + CFG.lost_evidence_us)
    core.probe_answered(PRIMARY, 4, quiet + later - now, later, quiet + later - now, 3)
    assert core.status is not Status.BACKUP          # three crashes: the survivor goes on


def test_a_lost_answer_counts_on_the_majority_side():
    """The machine of both primaries died: we still hear the other backup (a majority
    of our three), and the remote group's backup, which lost its primary with ours, is
    the only one left to ask."""
    core = _three()
    now = core.next_timer_us()
    while core.status is Status.BACKUP and not core.takeover_held:
        core._last_heard[OTHER] = now                # the junior backup speaks on
        core.handle_timer(now)
        now = core.next_timer_us()
    quiet = now - core._last_heard[PRIMARY]
    core._last_heard[OTHER] = now
    core.probe_answered(PRIMARY, 4, quiet, now, quiet, 2)
    assert core.status is not Status.BACKUP


def test_a_majority_heard_again_only_just_now_does_not_make_a_lost_answer_count():
    """Back from a cut shared with the answerer: we hear the other backup again a moment
    before our primary, which lives, would speak. Its lost answer waits two heartbeat
    intervals (replica_machine_cut_majority_heard_before_the_primary); with the primary
    still silent then, it counts (the majority side: our primary's machine died)."""
    core = _three()
    now = fire_detector(core)                        # nobody heard: a cut
    quiet = now - core._last_heard[PRIMARY]
    core.handle_message(heartbeat(OTHER, 4, rank=3), now)   # the heal: the other backup first
    core.probe_answered(PRIMARY, 4, quiet, now + 1, quiet, 3)
    assert core.status is Status.BACKUP
    later = now + 2 * CFG.heartbeat_interval_us
    core.handle_message(heartbeat(OTHER, 4, rank=3), later)
    # (the first answer only holds again: hearing the backup moved the detector)
    for t in (later, later + 1):
        core.probe_answered(PRIMARY, 4, quiet + t - now, t, quiet + t - now, 3)
    assert core.status is not Status.BACKUP


def test_a_lost_answer_counts_where_no_group_has_a_majority_to_find():
    core = backup()                                  # two members
    now = fire_detector(core)
    quiet = now - core._last_heard[PRIMARY]
    core.probe_answered(PRIMARY, 4, quiet, now, quiet, 2)
    assert core.status is Status.PRIMARY_PHASE2


def test_an_answer_from_a_member_in_touch_with_its_group_counts():
    core = _three()
    now = fire_detector(core)
    core.probe_answered(PRIMARY, 4, now - core._last_heard[PRIMARY], now, 0, 3)
    assert core.status is not Status.BACKUP


def test_a_primary_that_removed_its_silent_backups_has_not_found_a_majority():
    """What a PROBE answer says of us: a primary cut off from both its backups removes
    them, and is still quiet since it last heard them (the largest membership of the
    view counts), not a group of one that hears all of itself."""
    core = Membership(CFG, random.Random(2))
    core.start(0)
    core.birth = PRIMARY
    core.status = Status.PRIMARY
    core._install(4, 0, [Key(1, PRIMARY), Key(2, ME), Key(3, OTHER)], 3, 0)
    assert core.probe_state(1_000) == (0, 3)
    core._install(4, 1, [Key(1, PRIMARY)], 3, 80_000)   # removed both, silent since 0
    quiet, size = core.probe_state(100_000)
    assert size == 3 and quiet == 100_000


def test_an_answer_from_a_member_just_back_from_a_cut_says_how_long_it_was_cut_off():
    """What our PROBE answers say: cut off from both peers from ~0 to 200 ms, then in
    touch again; an answer about a primary last heard before the cut ended still says
    we were quiet since the cut began (we may be just back from a cut shared with the
    asker); one about a primary heard since says we are in touch (quiet 0)."""
    core = _three()
    advance(core, 200 * MS)                 # the others are silent from 0
    core.handle_message(heartbeat(PRIMARY, 4), 200 * MS)       # back: a majority again
    assert core.probe_state(201 * MS) == (0, 3)                 # in touch now
    quiet, size = core.probe_state(201 * MS, since_us=100 * MS)  # heard it in the cut
    assert size == 3 and quiet >= 200 * MS
    assert core.probe_state(201 * MS, since_us=200 * MS + 1) == (0, 3)


def test_a_silent_answer_after_one_naming_another_primary_of_ours_is_no_evidence():
    """replica_machine_cut_stale_answer_after_heal: two answers named the primary that
    took over meanwhile; then a remote member just back from the cut it shared with us
    said ours is silent, in touch with its group (quiet 0). No takeover on it, until
    live_remote_silence_us has passed without such news."""
    core = backup()
    now = fire_detector(core)
    silent = now - core._last_heard[PRIMARY]
    core.probe_answered(999, 5, 0, now)                      # another primary, view 5
    core.probe_answered(PRIMARY, 4, silent, now + 1, 0, 2)   # "silent", in touch
    assert core.status is Status.BACKUP and core.probes_alive == 2
    later = advance(core, now + CFG.live_remote_silence_us)
    core.probe_answered(PRIMARY, 4, silent + later - now, later, 0, 2)
    assert core.status is Status.PRIMARY_PHASE2


def test_a_member_of_our_view_heard_in_a_later_view_vetoes_evidence():
    """The group went on without us (a member of our view speaks in a later view):
    no remote word makes our state the group's."""
    core = _three()
    now = fire_detector(core)
    core.handle_message(heartbeat(OTHER, 5, rank=2), now)   # OTHER, a backup of view 5
    core.probe_answered(PRIMARY, 4, now - core._last_heard[PRIMARY], now + 1, 0, 3)
    assert core.status is Status.BACKUP
