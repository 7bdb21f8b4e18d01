"""What every `llft bench KIND` writes: a printed table, CSV, a markdown section, plots.

Results go to a folder (default `results/`, git-ignored): `<kind>.csv` (plus
`<kind>_<part>.csv` for raw or secondary tables), `<kind>.md`, `<kind>*.png`, and
`summary.md` gathers the latest markdown of every kind (the paper-style figures first,
see SUMMARY_ORDER), each section naming the command that produced it and embedding its
plots. Benchmarks compare against a baseline measured in the same run and report
ratios, because these machines are shared and noisy.

A kind's `run(args)` calls, in this order: `command_of(args, add_arguments)` (before
`--quick` rewrites its options), its tables' `write_csv`, `plot`/`bars` for each
figure, and `write_markdown(results, kind, sections, notes, plots=..., command=...)`.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import shlex
import statistics
import time

DEFAULT_RESULTS_DIR = "results"
# summary.md: these kinds first (the LLFT paper's figures: latency vs message size,
# throughput vs clients, latency vs nondeterministic operations, failover vs replicas),
# then any other kind present, alphabetically.
SUMMARY_ORDER = ["latency", "throughput", "ndlatency", "failover", "ndops", "messaging"]


def percentile(values: list[float], q: float) -> float:
    """q in [0, 100]; nearest-rank on sorted values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))
    return s[k]


def summarize_us(samples_us: list[float]) -> dict[str, float]:
    return {"n": len(samples_us), "median_us": statistics.median(samples_us) if samples_us else float("nan"),
            "p90_us": percentile(samples_us, 90), "p99_us": percentile(samples_us, 99),
            "min_us": min(samples_us) if samples_us else float("nan")}


class Table:
    def __init__(self, kind: str, title: str, columns: list[str]):
        self.kind, self.title, self.columns = kind, title, columns
        self.rows: list[dict] = []

    def add(self, **row) -> None:
        self.rows.append(row)

    @staticmethod
    def _fmt(v) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    def markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |\n|" + "---|" * len(self.columns) + "\n"
        body = "".join("| " + " | ".join(self._fmt(r.get(c, "")) for c in self.columns) + " |\n"
                       for r in self.rows)
        return f"### {self.title}\n\n{head}{body}"

    def print(self) -> None:
        widths = [max(len(c), *(len(self._fmt(r.get(c, ""))) for r in self.rows)) if self.rows
                  else len(c) for c in self.columns]
        print(self.title)
        print("  ".join(c.rjust(w) for c, w in zip(self.columns, widths)))
        for r in self.rows:
            print("  ".join(self._fmt(r.get(c, "")).rjust(w) for c, w in zip(self.columns, widths)))
        print()

    def write_csv(self, results_dir: str, name: str | None = None) -> str:
        os.makedirs(results_dir, exist_ok=True)
        path = os.path.join(results_dir, f"{name or self.kind}.csv")
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            w.writeheader()
            w.writerows(self.rows)
        return path


def detector_ms(fault_timeout_ms: float | None) -> str:
    """How a bench's notes name the detector it ran with (None: the configuration's)."""
    if fault_timeout_ms is None:
        from llft.runtime.config import ClusterConfig
        return f"{ClusterConfig.fault_timeout_ms:g} (the default)"
    return f"{fault_timeout_ms:g}"


def machine_line() -> str:
    return (f"{platform.node()} · {os.cpu_count()} cores · Python {platform.python_version()} · "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def command_of(args: argparse.Namespace, add_arguments, kind: str | None = None) -> str:
    """The `llft bench KIND ...` command line that reproduces `args`: the options that
    differ from the kind's defaults (rebuilt from its `add_arguments`). Call it before
    `--quick` rewrites the options."""
    kind = kind or getattr(args, "_kind", None) or "?"
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    words = ["llft", "bench", kind]
    for a in p._actions:                    # noqa: SLF001 -- argparse has no public list
        if not a.option_strings or not hasattr(args, a.dest):
            continue
        value = getattr(args, a.dest)
        if value == a.default:
            continue
        flag = max(a.option_strings, key=len)
        if a.nargs == 0:                    # store_true / store_false
            words.append(flag)
        else:
            words += [flag, str(value)]
    return shlex.join(words)


def _order(kinds: list[str]) -> list[str]:
    first = [k for k in SUMMARY_ORDER if k in kinds]
    last = [k for k in ("all",) if k in kinds]      # `llft bench all`'s run table
    return first + sorted(k for k in kinds if k not in SUMMARY_ORDER + last) + last


def write_markdown(results_dir: str, kind: str, sections: list[str], notes: str = "",
                   plots: list[str | None] | None = None, command: str | None = None) -> str:
    """Write `<kind>.md` and refresh `summary.md` from every `<kind>.md` present.

    `command`: the command line that produced these results (`command_of`), shown at the
    top; `plots`: PNG paths (None entries, when matplotlib is absent, are skipped),
    embedded after the tables by file name (they live next to the markdown)."""
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f"{kind}.md")
    with open(path, "w") as f:
        f.write(f"## llft bench {kind}\n\n{machine_line()}\n\n")
        if command:
            f.write(f"Reproduce: `{command}`\n\n")
        for s in sections:
            f.write(s + "\n")
        names = [os.path.basename(p) for p in (plots or []) if p]
        if names:
            f.write("Figures: " + ", ".join(f"[{n}]({n})" for n in names) + "\n\n")
            for n in names:
                f.write(f"![{n}]({n})\n\n")
        elif plots is not None:
            f.write("Figures: none (matplotlib missing)\n\n")
        if notes:
            f.write(notes.rstrip() + "\n")
    write_summary(results_dir)
    return path


def write_summary(results_dir: str) -> str:
    """`summary.md`: every `<kind>.md` of the folder, paper-style figures first."""
    kinds = [p[:-3] for p in os.listdir(results_dir)
             if p.endswith(".md") and p != "summary.md"]
    path = os.path.join(results_dir, "summary.md")
    with open(path, "w") as f:
        f.write("# llft benchmark summary\n\n"
                "Each section names the command that produced it (`llft bench all --quick` "
                "runs every kind). Numbers come from whatever machine ran them; compare the "
                "ratios to the baseline measured in the same run.\n\n")
        for k in _order(kinds):
            with open(os.path.join(results_dir, f"{k}.md")) as g:
                f.write(g.read() + "\n")
    return path


def fit_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs (nan with fewer than two distinct xs)."""
    pts = [(x, y) for x, y in zip(xs, ys) if y == y]
    if len({x for x, _ in pts}) < 2:
        return float("nan")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(results_dir: str, name: str, title: str, xlabel: str, ylabel: str,
         series: dict[str, tuple[list, list]], logx: bool = False, logy: bool = False,
         xticks: list | None = None, symlogx: bool = False) -> str | None:
    """A line plot in the style of the LLFT paper's figures; None if matplotlib is absent.
    `symlogx`: a log x axis that also shows x = 0 (operations per request)."""
    plt = _pyplot()
    if plt is None:
        return None
    os.makedirs(results_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    for label, (xs, ys) in series.items():
        pts = [(x, y) for x, y in zip(xs, ys) if isinstance(y, (int, float)) and not math.isnan(y)]
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    elif symlogx:
        ax.set_xscale("symlog", linthresh=1)
    if logy:
        ax.set_yscale("log")
    if xticks:
        ax.set_xticks(xticks)
        ax.set_xticklabels([str(x) for x in xticks])
    ax.set_xlabel(xlabel)
    ax.grid(True, alpha=0.3)
    return _save(plt, fig, ax, results_dir, name, title, ylabel)


def bars(results_dir: str, name: str, title: str, ylabel: str, groups: list[str],
         series: dict[str, list[float]], logy: bool = False) -> str | None:
    """Grouped bars (one group per entry of `groups`, one bar per series); None if
    matplotlib is absent."""
    plt = _pyplot()
    if plt is None:
        return None
    os.makedirs(results_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    width = 0.8 / max(1, len(series))
    for i, (label, ys) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [0 if y != y else y for y in ys], width, label=label)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, axis="y", alpha=0.3)
    return _save(plt, fig, ax, results_dir, name, title, ylabel)


def timelines(results_dir: str, name: str, title: str, xlabel: str, ylabel: str,
              series: dict[str, tuple[list, list, str]], marks: dict[str, list[float]]
              ) -> str | None:
    """Step lines (label -> (xs, ys, matplotlib line style)), each series' own colour
    shared by its marks (label -> x positions, drawn as dotted vertical lines: e.g. the
    kills); None if matplotlib is absent."""
    plt = _pyplot()
    if plt is None:
        return None
    os.makedirs(results_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    colours: dict[str, str] = {}
    for label, (xs, ys, style) in series.items():
        group = label.split(" ")[0]
        line, = ax.step(xs, ys, style, where="post", label=label, color=colours.get(group))
        colours.setdefault(group, line.get_color())
    for label, xs in marks.items():
        for i, x in enumerate(xs):
            ax.axvline(x, linestyle=":", color=colours.get(label.split(" ")[0]),
                       label=label if i == 0 else None)
    ax.set_xlabel(xlabel)
    ax.grid(True, alpha=0.3)
    return _save(plt, fig, ax, results_dir, name, title, ylabel)


def _save(plt, fig, ax, results_dir: str, name: str, title: str, ylabel: str) -> str:
    """Title, y label, legend; write `<name>.png` into results_dir."""
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    path = os.path.join(results_dir, f"{name}.png")
    fig.savefig(path)
    plt.close(fig)
    return path
