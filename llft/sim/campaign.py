"""One campaign runner for `llft simulate KIND`, and the scenario scripts it reads and writes.

Theory of operation
-------------------
A simulator kind (messaging, membership, replica) is a `Campaign`: its check module knows
how to run a schedule from a *schedule seed* and the campaign's parameters (`run_seed`), and
how to run a *scenario script* (`run_script`); both return an `Outcome` (violations, coverage
counters, and the `Script` of the schedule that ran). The runner owns the rest, the same for
every kind:

  seeds     schedule i of campaign seed S runs schedule seed `schedule_seed(KIND, S, i)`;
  flags     --schedules N --seed S [--verbose], --replay SEED [--dump FILE], --scenario FILE,
            plus the kind's parameters (`Param`, e.g. --loss), echoed in the replay command;
  output    one line per failing schedule (`seed S (schedule i): first violation`) and the
            command that replays it; the last line is `N schedules, K violations`; the exit
            status is non-zero when K > 0 (a scenario: when the outcome is not as expected);
  liveness  `run_until_done(sim, done, bound_us, step_us)`: run in steps until a predicate
            holds or the bound passes, used by every check's quiet phase.

Scenario scripts
----------------
A generator draws a schedule from its seed; some of its choices are made while the schedule
runs ("crash whichever replica is primary now"). The `Script` records every decision as it
takes effect, so a scenario replays the same run with no generator at all: a change to a
generator changes what a seed means, never what a scenario file means. The randomness that
is not the schedule (per-datagram loss and delays, the applications' pacing) stays seeded,
and the scenario names those seeds. The format is line-based text:

    # why this scenario exists        comments; the leading block describes the scenario
    simulate membership               the kind (the first line that is not a comment)
    set NAME VALUE...                 a parameter of the schedule (replicas, faults, ...)
    seed NAME N                       a seed of randomness that is not the schedule
    round 2 after 37000us             (membership) a round starting after the last converged
    at 1200us crash n2                an event; times in microseconds (in membership,
    at 3000us partition n0 | n1 n2      relative to their round); `|` separates sides
    expect 0 violations               the expected outcome, compared after the run; or
    expect violation TEXT             a violation containing TEXT must be reported
    expect at least N COUNTER         the run still exercises what the bug needed (a
                                        coverage counter of --verbose, e.g. `crashes`)

Each kind documents its own lines (`set`, `seed` and event words) in its module header. A
`#` after a line's words starts a comment.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import multiprocessing
import os
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from llft.lifetime import die_with


class ScenarioError(ValueError):
    """A scenario file that cannot be read."""


# a campaign whose first schedule, timed, says the rest would take this long or more in
# one process runs the rest in worker processes (`_each`): spawning them costs ~1 s
PARALLEL_AFTER_S = 2.0


def sim_jobs() -> int:
    """How many worker processes a long campaign uses: the cores this process may run on
    (at most 4), or LLFT_SIM_JOBS."""
    env = os.environ.get("LLFT_SIM_JOBS")
    if env:
        return max(1, int(env))
    return max(1, min(4, len(os.sched_getaffinity(0))))


def _worker_start(check_watermark: bool, parent_pid: int) -> None:
    # a worker dies with the campaign (SIGKILL on its parent's death): a campaign killed
    # with SIGTERM left its workers running out their chunks (~100 schedules) as orphans
    die_with(parent_pid, exit_code=1)
    # a spawned worker imports the checks afresh: the parent's switches are set again
    from llft.protocol.messaging import endpoint
    endpoint.CHECK_WATERMARK = check_watermark


def _first_violation(run_seed: Callable[..., "Outcome"], params: dict,
                     seed: int) -> str | None:
    v = run_seed(seed, **params).violations
    return v[0] if v else None


def _outcome(run_seed: Callable[..., "Outcome"], kind: str, params: dict,
             seed: int) -> "Outcome":
    """Run one schedule: a crash of a core is a violation too."""
    try:
        return run_seed(seed, **params)
    except Exception as e:
        return Outcome([f"exception: {type(e).__name__}: {e}"], Script(kind))


def _each(check: Callable[[Any], Any], items: list) -> Iterator[Any]:
    """`check(item)` for every item (a schedule seed, a scenario's path), in order. The
    first runs here, timed; if the rest would take `PARALLEL_AFTER_S` or more at that
    pace, they run on `sim_jobs()` spawned workers (`check` must pickle: a partial of
    module-level functions). Items are independent and pure CPU: the results are the
    same either way."""
    jobs = sim_jobs()
    if jobs == 1 or len(items) < 3:
        yield from map(check, items)
        return
    t0 = time.perf_counter()
    yield check(items[0])
    rest = items[1:]
    if (time.perf_counter() - t0) * len(rest) < PARALLEL_AFTER_S:
        yield from map(check, rest)
        return
    from llft.protocol.messaging import endpoint
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_start,
                             initargs=(endpoint.CHECK_WATERMARK, os.getpid())) as pool:
        yield from pool.map(check, rest, chunksize=max(1, len(rest) // (8 * jobs)))


def schedule_seed(kind: str, seed: int, index: int) -> int:
    """The seed of schedule `index` of the campaign `seed` of simulator `kind`."""
    h = hashlib.sha256(f"llft-{kind}/{seed}/{index}".encode()).digest()
    return int.from_bytes(h[:8], "big")


def run_until_done(sim, done: Callable[[], bool], bound_us: int, step_us: int) -> int | None:
    """Run `sim` in steps of `step_us` until `done()` holds after a step (return the time it
    took) or `bound_us` has passed since the call (return None)."""
    start = sim.now_us
    while sim.now_us < start + bound_us:
        sim.run_for(step_us)
        if done():
            return sim.now_us - start
    return None


def us(word: str) -> int:
    """'1200us' -> 1200."""
    if not word.endswith("us"):
        raise ScenarioError(f"a time is written like 1200us, not {word!r}")
    return int(word[:-2])


# `set messaging` keys that give the cores the timing a scenario was recorded with, where
# a default changed since and the scenario's outcome depends on the old one (the
# regressions' README): heartbeat refresh in intervals (before Pulses: `pulse 1`), a
# backup's ack delay for a direct ORDER_INFO (before it acked at once: `direct-ack 500`),
# a backup's order-info ack and watermark report delays and the primary's resend of
# unacked order info (before 2026-12-02: `oi-ack 500 report 1000 intra 3000`)
TIMING_KEYS = {"pulse": "pulse_intervals", "direct-ack": "order_info_direct_ack_us",
               "oi-ack": "order_info_ack_us", "report": "watermark_report_us",
               "intra": "order_info_intra_us"}


def messaging_timing(pairs: dict) -> dict[str, int]:
    """MessagingConfig keyword arguments for the TIMING_KEYS of a `set messaging` line."""
    return {field: int(pairs[key]) for key, field in TIMING_KEYS.items() if key in pairs}


def sides(words: list[str] | tuple[str, ...]) -> list[list[str]]:
    """'a b | c' -> [['a', 'b'], ['c']]."""
    out: list[list[str]] = [[]]
    for w in words:
        if w == "|":
            out.append([])
        else:
            out[-1].append(w)
    return out


# -- scripts -----------------------------------------------------------------------------

@dataclass
class Script:
    """A schedule written out: what a scenario file holds (see the module header)."""
    kind: str
    lines: list[tuple[str, ...]] = field(default_factory=list)   # every line's words
    expect: list[tuple[str, ...]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)            # the leading block

    def add(self, *words: Any) -> None:
        self.lines.append(tuple(str(w) for w in words))

    def at(self, t_us: int, *words: Any) -> None:
        self.add("at", f"{t_us}us", *words)

    def get(self, verb: str, name: str) -> tuple[str, ...]:
        """The values of line `verb name ...` (e.g. `set faults`, `seed sim`)."""
        for line in self.lines:
            if line[:2] == (verb, name):
                return line[2:]
        raise ScenarioError(f"{self.kind} scenario has no `{verb} {name}` line")

    def pairs(self, verb: str, name: str) -> dict[str, str]:
        """`set faults loss 0.2 dup 0` -> {'loss': '0.2', 'dup': '0'}."""
        v = self.get(verb, name)
        return dict(zip(v[0::2], v[1::2]))

    def seed(self, name: str) -> int:
        return int(self.get("seed", name)[0])

    def text(self) -> str:
        out = [f"# {c}".rstrip() for c in self.comments]
        out.append(f"simulate {self.kind}")
        out += [" ".join(line) for line in self.lines]
        out += [" ".join(("expect",) + e) for e in self.expect]
        return "\n".join(out) + "\n"

    @classmethod
    def parse(cls, text: str, source: str = "scenario") -> "Script":
        script: Script | None = None
        comments: list[str] = []
        for n, raw in enumerate(text.splitlines(), 1):
            if raw.lstrip().startswith("#"):
                if script is None:
                    comments.append(raw.lstrip()[1:].removeprefix(" "))
                continue
            words = tuple(raw.split("#", 1)[0].split())
            if not words:
                continue
            if script is None:
                if words[0] != "simulate" or len(words) != 2:
                    raise ScenarioError(f"{source}:{n}: expected `simulate KIND` first")
                script = cls(words[1], comments=comments)
            elif words[0] == "expect":
                script.expect.append(words[1:])
            else:
                script.lines.append(words)
        if script is None:
            raise ScenarioError(f"{source}: no `simulate KIND` line")
        if not script.expect:
            raise ScenarioError(f"{source}: no `expect` line")
        return script

    @classmethod
    def load(cls, path: str | Path) -> "Script":
        return cls.parse(Path(path).read_text(), str(path))


@dataclass
class Outcome:
    violations: list[str]
    script: Script
    stats: Counter = field(default_factory=Counter)    # coverage: what the run exercised
    took_us: int | None = None                         # convergence time, where measured


def expect_lines(outcome: Outcome) -> list[tuple[str, ...]]:
    """The expectation that describes `outcome` (what --dump writes)."""
    if not outcome.violations:
        return [("0", "violations")]
    return [("violation", *outcome.violations[0].split("#")[0].split())]   # '#': a comment


def unmet(script: Script, outcome: Outcome) -> list[str]:
    """The expectations of `script` that `outcome` does not meet (empty: as expected)."""
    out = []
    for words in script.expect:
        if words == ("0", "violations"):
            if outcome.violations:
                out.append(f"expected 0 violations, got {len(outcome.violations)}: "
                           f"{outcome.violations[0]}")
        elif words[:2] == ("at", "least") and len(words) > 3 and words[2].isdigit():
            name, n = " ".join(words[3:]), int(words[2])
            if outcome.stats.get(name, 0) < n:
                out.append(f"expected at least {n} {name}, got {outcome.stats.get(name, 0)}")
        elif words[:1] == ("violation",) and len(words) > 1:
            want = " ".join(words[1:])
            if not any(want in " ".join(v.split()) for v in outcome.violations):
                out.append(f"expected a violation containing {want!r}, got "
                           f"{outcome.violations[:1] or 'none'}")
        else:
            out.append(f"cannot read expectation `expect {' '.join(words)}`")
    return out


# -- the runner ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """A parameter of a kind's schedule generator, a flag of `llft simulate KIND`."""
    name: str                  # flag --name, keyword name with '-' -> '_'
    default: Any
    help: str

    @property
    def key(self) -> str:
        return self.name.replace("-", "_")


@dataclass
class Campaign:
    """One simulator kind, as the runner sees it."""
    kind: str
    run_seed: Callable[..., Outcome]      # (seed, trace=None, **params) -> Outcome
    run_script: Callable[..., Outcome]    # (script, trace=None) -> Outcome
    params: tuple[Param, ...] = ()
    schedules: int = 100                  # default --schedules
    header: Callable[[dict], list[str]] | None = None     # lines before a campaign
    summary: Callable[[list[Outcome]], list[str]] | None = None   # --verbose, after it
    verbose_line: Callable[[Outcome], str] | None = None  # --verbose, per good schedule
    about: str = ""                       # what the check is, for --help

    # -- the command line -----------------------------------------------------------------
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.description = " ".join(self.about.split()) + (
            " Runs seeded random schedules and checks every one. The last line is "
            "`N schedules, K violations`; the exit status is non-zero when K > 0. A failing "
            "schedule prints its seed and the command that replays it; --replay SEED --dump "
            "FILE writes it out as a scenario script, --scenario FILE runs one.")
        parser.add_argument("--schedules", type=int, default=self.schedules,
                            help=f"how many schedules (default {self.schedules})")
        parser.add_argument("--seed", type=int, default=1,
                            help="campaign seed: schedule i runs seed "
                                 f"sha256('llft-{self.kind}/SEED/i')[:8]")
        for p in self.params:
            if isinstance(p.default, bool):
                parser.add_argument(f"--{p.name}", action="store_true", help=p.help)
            else:
                parser.add_argument(f"--{p.name}", type=type(p.default), default=p.default,
                                    help=f"{p.help} (default {p.default})")
        parser.add_argument("--verbose", action="store_true",
                            help="one line per schedule and coverage counters")
        parser.add_argument("--replay", type=int, metavar="SEED",
                            help="run one schedule seed (as printed) with a trace of its events")
        parser.add_argument("--dump", metavar="FILE",
                            help="with --replay: write the schedule out as a scenario script")
        parser.add_argument("--scenario", metavar="FILE",
                            help="run a scenario script and compare with its `expect` lines")

    def run(self, args: argparse.Namespace) -> int:
        # checking is what a simulation is for: the messaging core's incremental
        # watermark against its definition on every call (a mismatch is a crash of the
        # core: a violation with its seed)
        from llft.protocol.messaging import endpoint
        endpoint.CHECK_WATERMARK = True
        if args.scenario is not None:
            return self._scenario(Path(args.scenario))
        params = {p.key: getattr(args, p.key) for p in self.params}
        if args.replay is not None:
            return self._replay(args.replay, params, args.dump)
        if args.dump is not None:
            raise SystemExit("--dump writes the schedule of --replay SEED")
        return self._campaign(args.schedules, args.seed, params, args.verbose)

    def replay_command(self, seed: int, params: dict) -> str:
        words = [f"llft simulate {self.kind} --replay {seed}"]
        for p in self.params:
            v = params.get(p.key, p.default)
            if v != p.default:
                words.append(f"--{p.name}" if isinstance(v, bool) else f"--{p.name} {v}")
        return " ".join(words)

    # -- the three modes ------------------------------------------------------------------
    def outcome(self, seed: int, params: dict) -> Outcome:
        """Run one schedule of a campaign: a crash of a core is a violation too."""
        return _outcome(self.run_seed, self.kind, params, seed)

    def failures(self, schedules: int, seed: int, **params) -> list[tuple[int, str]]:
        """(schedule seed, first violation) of every failing schedule of a campaign (for
        tests: an exception propagates). Schedules are independent and pure CPU: a
        campaign that would take seconds runs them on every core (`_each`), with the
        same results."""
        seeds = [schedule_seed(self.kind, seed, i) for i in range(schedules)]
        firsts = _each(functools.partial(_first_violation, self.run_seed, params), seeds)
        return [(s, v) for s, v in zip(seeds, firsts) if v is not None]

    def _campaign(self, schedules: int, seed: int, params: dict, verbose: bool) -> int:
        for line in self.header(params) if self.header else ():
            print(line)
        bad = 0
        outcomes = []
        t0 = time.monotonic()
        seeds = [schedule_seed(self.kind, seed, i) for i in range(schedules)]
        each = _each(functools.partial(_outcome, self.run_seed, self.kind, params), seeds)
        for i, (s, o) in enumerate(zip(seeds, each)):
            outcomes.append(o)
            v = o.violations
            if v:
                bad += 1
                more = f" (+{len(v) - 1} more)" if len(v) > 1 else ""
                print(f"seed {s} (schedule {i}): {v[0]}{more}")
                print(f"  replay: {self.replay_command(s, params)}", flush=True)
            elif verbose:
                extra = self.verbose_line(o) if self.verbose_line else "ok"
                print(f"seed {s} (schedule {i}): {extra}")
        if verbose:
            total: Counter = Counter()
            for o in outcomes:
                total.update(o.stats)
            for k, n in sorted(total.items()):
                print(f"  {k}: {n}")
            for line in self.summary(outcomes) if self.summary else ():
                print(line)
        print(f"({time.monotonic() - t0:.1f} s)", file=sys.stderr)
        print(f"{schedules} schedules, {bad} violations")
        return 1 if bad else 0

    def _replay(self, seed: int, params: dict, dump: str | None) -> int:
        o = self.run_seed(seed, trace=print, **params)
        for v in o.violations:
            print(f"VIOLATION {v}")
        if dump is not None:
            o.script.comments = [self.replay_command(seed, params)]
            o.script.expect = expect_lines(o)
            Path(dump).write_text(o.script.text())
            print(f"scenario written to {dump}")
        print(f"1 schedules, {1 if o.violations else 0} violations")
        return 1 if o.violations else 0

    def _scenario(self, path: Path) -> int:
        try:
            script = Script.load(path)
            if script.kind != self.kind:
                raise ScenarioError(f"{path} is a {script.kind} scenario: "
                                    f"llft simulate {script.kind} --scenario {path}")
            o = self.run_script(script, trace=print)
        except (ScenarioError, OSError) as e:
            print(f"llft simulate {self.kind}: {e}", file=sys.stderr)
            return 2
        for v in o.violations:
            print(f"VIOLATION {v}")
        missed = unmet(script, o)
        for m in missed:
            print(f"NOT AS EXPECTED: {m}")
        if not missed:
            print(f"{path}: as expected ({'; '.join(' '.join(e) for e in script.expect)})")
        print(f"1 schedules, {1 if o.violations else 0} violations")
        return 1 if missed else 0


def campaigns() -> dict[str, "Campaign"]:
    """Every simulator kind's campaign, by kind."""
    from llft.sim import membership_check, messaging_check, replica_check   # they import us
    return {c.kind: c for c in (messaging_check.CAMPAIGN, membership_check.CAMPAIGN,
                                replica_check.CAMPAIGN)}


def scenario_unmet(path: Path) -> list[str]:
    """Run a scenario script; what it expected and did not get (`unmet`)."""
    script = Script.load(path)
    try:
        return unmet(script, campaigns()[script.kind].run_script(script))
    except Exception:               # a crash of a core: this scenario fails, not the batch
        return [f"exception:\n{traceback.format_exc()}"]


def scenarios_unmet(paths: list[Path]) -> list[list[str]]:
    """`scenario_unmet` of each path, in order, on every core when that pays (`_each`):
    the regression scenarios take minutes in one process."""
    return list(_each(scenario_unmet, list(paths)))


def scenario_files(folder: str | Path, kind: str | None = None) -> Iterator[Path]:
    """The scenario scripts in `folder` (of one kind, if given), by name."""
    for path in sorted(Path(folder).glob("*.scenario")):
        if kind is None or Script.load(path).kind == kind:
            yield path
