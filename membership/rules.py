"""The LLFT membership rules as data and pure functions (no state, no I/O).

Theory of operation
-------------------
The paper states the change-of-primary rules as three bullets (section "membership
protocol", first phase). We read the paper's symbols as follows (the arXiv text lost
them; the proofs of theorem 1 fix their direction):

    v        the primary view number the receiver is in (`mypvn`)
    p        the precedence of the proposer (the self-appointed new primary)
    q        the precedence of the receiver
    higher   later-joined; precedences only grow, so a newer member has a higher one

and the three outcomes of receiving ProposePrimary for the new view v+1:

    ACCEPT  (pseudocode lines 21-24) the receiver is included (which implies q > p),
            it has not generated a ProposePrimary for v+1, and it has not acknowledged
            a ProposePrimary for v+1 from a proposer with precedence > p.
    RESET   (line 25) the message is for v+1 *or a subsequent view*, the receiver is
            NOT included, it has not [generated a ProposePrimary for v+1 and q > p],
            and it has not received a ProposePrimary for v+1 from precedence > p.
    IGNORE  everything else (the paper: "the sets of conditions ... are not
            complementary and collectively exhaustive").

The proposer's own rule (lines 1-5): a backup whose fault detector fires on the primary
of view v proposes itself for v+1 unless it has received a ProposePrimary for that view
from a backup of *lower* precedence (a more senior backup already took over); it
excludes the old primary and every backup of precedence < its own, "because that backup
did not send a ProposePrimary message quickly enough to become the new primary".

The paper assumes every ProposePrimary a replica sees replaces its own view v. After a
partition that is not so: two branches can both hold a view numbered v. The core
therefore applies these rules only to a proposal whose parent view (old_pvn,
old_primary) is the receiver's own view (or, for a view the receiver holds by
acknowledging a proposal, the same parent); any other proposal belongs to another
branch and is left to precedence pruning (`competing_primary_wins`).

After a heal the branch kept is the one that served remote groups in its view, then the
one with the higher primary (`competing_primary_wins`).

Precedences alone can tie across partitioned branches (each branch's primary assigns
"the next precedence" independently), so replicas are compared by the key
(precedence, birth_id): unique, and totally ordered the same way everywhere.
"""
from __future__ import annotations

import enum
from typing import NamedTuple


class Key(NamedTuple):
    """Total order on replicas: precedence first, birth id breaks cross-branch ties."""
    precedence: int
    birth: int


class PPDecision(enum.Enum):
    ACCEPT = "accept"     # adopt the proposed membership and acknowledge (lines 21-24)
    RESET = "reset"       # reset state and rejoin with ProposeBackup (line 25)
    IGNORE = "ignore"


def decide_propose_primary(*, target: int, my_pvn: int, my_key: Key, proposer: Key,
                           included: bool, generated_target: int | None,
                           acked: Key | None, seen_max: Key | None,
                           accepted_by_proposal: bool) -> PPDecision:
    """Classify one ProposePrimary(target = old_pvn + 1) at a member.

    `acked`: the proposer whose ProposePrimary for `target` this replica acknowledged
    (None if none); `seen_max`: the highest proposer seen for `target` (this message
    included or not, the comparison is strict); `generated_target`: the view this
    replica proposed itself for, if any; `accepted_by_proposal`: this replica's current
    view (my_pvn) was entered by acknowledging a ProposePrimary, so a competing proposal
    for that same number is still "the new view" to it.
    """
    # "the new primary view v+1": the next view, or the one we only hold by acking a
    # proposal (or by proposing ourselves) that a competing proposal may still override.
    is_new = target == my_pvn + 1 or (
        target == my_pvn and (accepted_by_proposal or generated_target == target))
    generated = generated_target == target
    if included:
        if (is_new and not generated
                and (acked is None or not acked > proposer)):
            return PPDecision.ACCEPT
        return PPDecision.IGNORE
    if not (is_new or target > my_pvn + 1):
        return PPDecision.IGNORE          # stale: for a view we already left behind
    if generated and my_key > proposer:
        return PPDecision.IGNORE          # we compete and we win: the proposer resets
    if seen_max is not None and seen_max > proposer:
        return PPDecision.IGNORE          # a higher proposer for the same view exists
    return PPDecision.RESET


def proposal_members(members: list[Key], primary: Key, me: Key) -> list[Key]:
    """Line 4: the proposed membership excludes the old primary and every backup of
    lower precedence than the proposer; ordered by key, so the proposer comes first."""
    return sorted(m for m in members if m != primary and m >= me)


def may_propose(*, my_key: Key, seen_min: Key | None) -> bool:
    """Lines 1-3: propose unless a ProposePrimary for the same view has arrived from a
    backup of lower precedence (a more senior backup is taking over)."""
    return seen_min is None or not seen_min < my_key


def competing_primary_wins(*, mine: Key | None, theirs: Key, mine_served: bool = False,
                           theirs_served: bool | None = None, mine_lineage: int = 0,
                           theirs_lineage: int = 0) -> bool:
    """Messaging lines 18-20 / theorem 1 case 2: a message from the primary of a
    competing membership whose primary has higher precedence prunes our branch.

    Beyond the paper: a branch whose primary has received data from a remote group in
    its view ("served": a client may have seen its output) outranks one that has not,
    whatever the precedences. A backup cut off alone with no connection takes over its
    own branch (it has nobody to ask: membership/core.py "Takeover needs evidence");
    meanwhile the other side may open connections and serve them, and a heal decided by
    precedence alone rolled those replies back. `theirs_served` None: the message does
    not say (only HEARTBEATs do); then a served branch of ours waits for their
    heartbeat.

    Before both: the older lineage (`lineage_of`: the lower view number its lineage was
    founded at, then the earlier founding; 0: unknown) wins. A replica reset while cut
    off hears no member and founds the group anew, with an empty state, at a view above
    every view it heard of; a replica restarted while cut off (a new process: it heard
    nothing) founds it at view 1, like the group's first founder, but later: a branch
    that continues the group's lineage must outrank either, served or not."""
    if mine is None:
        return True
    if theirs_served is None:
        return not mine_served and theirs > mine
    if mine_lineage and theirs_lineage and mine_lineage != theirs_lineage:
        return theirs_lineage < mine_lineage
    if mine_served != theirs_served:
        return theirs_served
    return theirs > mine


LINEAGE_TIME_BITS = 44       # founding milliseconds since the epoch: until the year 2527
_LINEAGE_TIME_MASK = (1 << LINEAGE_TIME_BITS) - 1


def lineage_of(founded_pvn: int, founded_ms: int) -> int:
    """A lineage's name: the view number it was founded at and the wall-clock millisecond
    of its founding, in one non-negative int so that a lower one is an older lineage.
    The view number orders a lineage founded anew by a reset replica (above every view it
    heard of) after the one it left; the time orders two founded at the same view number
    by replicas that heard nothing of each other (a group's first founder, and a replica
    restarted while cut off from that group: without the time they tied, and the
    precedences of two founders tie too, so the birth ids' coin decided which group kept
    its state). Clocks of different hosts need only agree to better than the time between
    the two foundings."""
    return (founded_pvn << LINEAGE_TIME_BITS) | (founded_ms & _LINEAGE_TIME_MASK)


def describe_lineage(lineage: int) -> str:
    if not lineage:
        return "unknown"
    return f"v{lineage >> LINEAGE_TIME_BITS}@{lineage & _LINEAGE_TIME_MASK}ms"


def fault_timeout_us(rank: int, *, timeout_base_us: int, inaction_us: int,
                     skew_us: int) -> int:
    """Timeout of the fault detector a backup of `rank` runs on its primary.

    The paper: rank 2 waits `base` for the primary; rank 3 also allows the rank-2
    backup's inaction and the skew between the two detectors (10, 30 ms in its
    example); each further rank adds one more predecessor's inaction plus skew.
    """
    if rank < 2:
        raise ValueError(f"rank {rank} runs no fault detector on the primary")
    return timeout_base_us + (rank - 2) * (inaction_us + skew_us)
