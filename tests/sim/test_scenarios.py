"""Scenario scripts (llft/sim/campaign.py): every regression scenario in
tests/sim/regressions/ meets its expectation; a dumped schedule replays the run of its seed;
an expectation that does not hold fails."""
from __future__ import annotations

from pathlib import Path

import pytest

from llft import cli
from llft.sim.campaign import (Outcome, Script, campaigns, expect_lines, scenario_files,
                               scenarios_unmet, schedule_seed)

REGRESSIONS = Path(__file__).parent / "regressions"
CAMPAIGNS = campaigns()


@pytest.fixture(scope="module")
def regressions_unmet(request) -> dict[Path, list[str]]:
    """Every selected regression scenario, run at once on every core (they are minutes of
    pure CPU in one process): path -> what it expected and did not get."""
    paths = [item.callspec.params["path"] for item in request.session.items
             if getattr(item, "originalname", None) == "test_regression_scenario"]
    return dict(zip(paths, scenarios_unmet(paths)))


@pytest.mark.parametrize("path", list(scenario_files(REGRESSIONS)), ids=lambda p: p.stem)
def test_regression_scenario(path, regressions_unmet):
    assert regressions_unmet[path] == []


def test_every_regression_file_is_a_scenario():
    files = sorted(p.name for p in REGRESSIONS.iterdir() if p.name != "README.md")
    assert files and all(f.endswith(".scenario") for f in files)
    assert {Script.load(REGRESSIONS / f).kind for f in files} == set(CAMPAIGNS)


@pytest.mark.parametrize("kind,params", [
    ("messaging", dict(loss=0.2, dup=0.05, reorder=0.1, failover=0.5)),
    ("membership", {}),
    ("replica", dict(random_cuts=True)),
    ("replica", dict(streams=3)),
])
def test_a_dumped_schedule_replays_the_run_of_its_seed(kind, params):
    campaign = CAMPAIGNS[kind]
    for i in range(2):
        seed = schedule_seed(kind, 5, i)
        ran = campaign.run_seed(seed, **params)
        ran.script.expect = expect_lines(ran)
        text = ran.script.text()
        again = campaign.run_script(Script.parse(text))
        assert again.violations == ran.violations
        assert again.stats == ran.stats and again.took_us == ran.took_us
        again.script.expect = ran.script.expect               # the same events, in order
        assert Script.parse(again.script.text()).lines == Script.parse(text).lines


def test_text_round_trip():
    text = ("# why\n#\n# how\nsimulate membership\nset replicas 3\nround 1\n"
            "at 5us partition n0 | n1 n2  # a comment\nexpect 0 violations\n")
    s = Script.parse(text)
    assert s.comments == ["why", "", "how"] and s.kind == "membership"
    assert s.lines[-1] == ("at", "5us", "partition", "n0", "|", "n1", "n2")
    assert Script.parse(s.text()) == s


def test_a_wrong_expectation_fails(tmp_path, capsys):
    path = sorted(REGRESSIONS.glob("membership_*.scenario"))[0]
    good = path.read_text()
    assert cli.main(["simulate", "membership", "--scenario", str(path)]) == 0
    for wrong in ("expect violation convergence", "expect 1 violations",
                  "expect 0 violations\nexpect at least 1000000 crashes"):
        bad = tmp_path / "bad.scenario"
        bad.write_text(good.replace("expect 0 violations", wrong))
        assert cli.main(["simulate", "membership", "--scenario", str(bad)]) == 1
        assert "NOT AS EXPECTED" in capsys.readouterr().out


def test_replay_dump_then_scenario(tmp_path, capsys):
    path = tmp_path / "s.scenario"
    seed = schedule_seed("replica", 3, 0)
    assert cli.main(["simulate", "replica", "--replay", str(seed), "--dump", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "1 schedules, 0 violations"
    script = Script.load(path)
    assert script.expect == [("0", "violations")]
    assert f"--replay {seed}" in script.comments[0]
    assert cli.main(["simulate", "replica", "--scenario", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 schedules, 0 violations"


def test_a_failing_schedule_prints_the_command_that_replays_it(monkeypatch, capsys):
    monkeypatch.setattr(CAMPAIGNS["messaging"], "run_seed",
                        lambda seed, **kw: Outcome(["boom"], Script("messaging")))
    assert cli.main(["simulate", "messaging", "--schedules", "1", "--seed", "3",
                     "--loss", "0.2"]) == 1
    seed = schedule_seed("messaging", 3, 0)
    assert capsys.readouterr().out.splitlines() == [
        f"seed {seed} (schedule 0): boom",
        f"  replay: llft simulate messaging --replay {seed} --loss 0.2",
        "1 schedules, 1 violations"]
