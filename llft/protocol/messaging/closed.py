"""The connections a replica has freed, kept so that a late or duplicated message can
never bring one back to life (as a new connection the application would accept).

Connection sequence numbers are never reused (a gateway numbers its clients from a random
base, a group its connections from 1), and connections mostly end in the order they
began: kept as merged [lo, hi) ranges per (remote group, role), the set stays a handful
of ranges however many connections ended.
"""
from __future__ import annotations

from bisect import bisect_right

from llft.protocol.messaging.config import ConnId


class ClosedSeqs:
    __slots__ = ("_ranges",)

    def __init__(self) -> None:
        # (remote_group, role) -> sorted, disjoint, non-adjacent [lo, hi) ranges
        self._ranges: dict[tuple, list[list[int]]] = {}

    def __contains__(self, cid: ConnId) -> bool:
        rs = self._ranges.get((cid[0], int(cid[2])))
        if not rs:
            return False
        i = bisect_right(rs, [cid[1], float("inf")]) - 1
        return i >= 0 and rs[i][0] <= cid[1] < rs[i][1]

    def add(self, cid: ConnId) -> None:
        seq = cid[1]
        rs = self._ranges.setdefault((cid[0], int(cid[2])), [])
        i = bisect_right(rs, [seq, float("inf")]) - 1
        if i >= 0 and rs[i][0] <= seq < rs[i][1]:
            return
        left = i >= 0 and rs[i][1] == seq
        right = i + 1 < len(rs) and rs[i + 1][0] == seq + 1
        if left and right:
            rs[i][1] = rs[i + 1][1]
            del rs[i + 1]
        elif left:
            rs[i][1] = seq + 1
        elif right:
            rs[i + 1][0] = seq
        else:
            rs.insert(i + 1, [seq, seq + 1])

    def ranges(self) -> int:
        return sum(len(rs) for rs in self._ranges.values())

    def to_list(self) -> list:
        """Plain data (a snapshot for a joining backup)."""
        return [[g, role, [list(r) for r in rs]] for (g, role), rs in self._ranges.items()]

    @classmethod
    def from_list(cls, data: list) -> "ClosedSeqs":
        c = cls()
        for g, role, rs in data:
            c._ranges[(g, int(role))] = [[int(lo), int(hi)] for lo, hi in rs]
        return c
