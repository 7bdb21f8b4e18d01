"""`llft demo`'s client-visible pause at a kill (llft/demos/service.py `pause_at`)."""
from llft.demos.service import pause_at


def test_replies_in_flight_at_the_kill_do_not_hide_the_outage():
    # replies every 1 ms, the primary killed at 10.0, two replies it had sent arrive
    # 2 and 3 ms later, then nothing until the new primary answers 100 ms later
    before = [i / 1000 for i in range(10_001)]                  # 0 .. 10.000
    times = before + [10.002, 10.003] + [10.103 + i / 1000 for i in range(50)]
    assert abs(pause_at(times, 10.0, 20.0) - 0.100) < 1e-9
    # the first reply after the kill ends the pause when it is the outage's end
    assert abs(pause_at(before + [10.12, 10.121], 10.0, 20.0) - 0.12) < 1e-9
    # only up to the next kill; no reply after the kill: nothing measured
    assert abs(pause_at(times + [30.0], 10.0, 20.0) - 0.100) < 1e-9
    assert pause_at(before, 10.0, 20.0) == 0.0
