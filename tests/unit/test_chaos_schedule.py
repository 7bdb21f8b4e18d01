"""llft chaos: the schedule is data, a pure function of its arguments (a failing seed
re-runs exactly), and the clients' problems are counted in the right column."""
from llft.tools import chaos
from llft.tools.loadclient import LoadResult


def test_schedule_is_a_function_of_the_seed():
    a = chaos.schedule(5, 50)
    assert a == chaos.schedule(5, 50)
    assert a != chaos.schedule(6, 50)
    assert {f.kind for f in a} == set(chaos.KINDS)
    for f in a:
        lo, hi = chaos.HOLD_S.get(f.kind, (0.0, 0.0))
        assert lo <= f.hold_s <= hi and chaos.DELAY_S[0] <= f.delay_s <= chaos.DELAY_S[1]
    # a prefix of a longer campaign is the shorter campaign
    assert chaos.schedule(5, 10) == a[:10]


def test_two_replicas_never_lose_both():
    assert "kill_both" not in {f.kind for f in chaos.schedule(1, 100, replicas=2)}


def test_classify_counts_lost_duplicated_and_wrong():
    errors = ["client 0: INCR #5: key count 4, expected 5 (a request executed twice?)",
              "client 1: INCR #9: service clock went backwards (2.0 -> 1.0)",
              "client 1: INCR #10: unexpected reply b''",
              "client 0: no reply to INCR #6 within the timeout"]
    r = LoadResult(mode="counter", clients=2, requests=20, replies=18, errors=errors,
                   error_count=len(errors), latencies=[], reply_times=[[], []], started=0.0,
                   elapsed_s=1.0, max_gap_s=0.0, max_gap_at_s=0.0, max_gap_client=0,
                   global_repeats=1)
    # the unreadable reply ended client 1: wrong, not also lost; the timeout is lost
    assert chaos.classify(r) == (1, 2, 2)


def test_a_failing_campaign_keeps_its_logs_without_being_asked(monkeypatch, tmp_path, capsys):
    """A failure seen once in forty runs must not need a forty-first with --keep."""
    import os
    import re

    from llft.cli import main
    monkeypatch.setattr(chaos.tempfile, "tempdir", str(tmp_path))
    for leftovers, kept in (([], False), (["pid 1 (a stray)"], True)):
        monkeypatch.setattr(chaos, "campaign", lambda work, wl, faults, replicas, clients, seed,
                            say, fresh_every, lo=leftovers: chaos.Report(
                                seed, wl.name, replicas, [], list(lo), 0))
        rc = main(["chaos", "--workload", "kv", "--faults", "1", "--seed", "3",
                   "--kinds", "kill_backup"])
        out = capsys.readouterr().out
        assert rc == (1 if kept else 0)
        folders = [d for d in os.listdir(tmp_path) if d.startswith("llft-chaos-")]
        assert bool(folders) == kept
        if kept:
            assert re.search(r"work folder kept: \S+llft-chaos-", out)
