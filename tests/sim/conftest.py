"""What the simulator tests share."""
from __future__ import annotations

import pytest


@pytest.fixture
def release_all_but_last():
    """A one-rule mutant of the backup lane's `_release_all_held` (rule 2): a gw rise
    releases all but the last message it covers on each connection."""
    def keeps_last(self):
        gw = self.loan.gw
        for hc in self.loan.conns:
            n = 0
            while n < len(hc.held) and hc.held[n].ts <= gw:
                n += 1
            for m in hc.held[:max(0, n - 1)]:
                self._deliver(hc, m.body["offset"], m.body["data"])
            del hc.held[:max(0, n - 1)]
    return keeps_last
