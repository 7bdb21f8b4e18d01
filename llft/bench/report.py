"""What every `llft bench KIND` writes: a printed table, CSV, a markdown section, plots.

Results go to a folder (default `results/`, git-ignored): `<kind>.csv`, `<kind>.md`,
`<kind>_*.png`, and `summary.md` gathers the latest markdown of every kind. Benchmarks
compare against a baseline measured in the same run and report ratios, because these
machines are shared and noisy.
"""
from __future__ import annotations

import csv
import os
import platform
import statistics
import time

DEFAULT_RESULTS_DIR = "results"


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


def machine_line() -> str:
    return (f"{platform.node()} · {os.cpu_count()} cores · Python {platform.python_version()} · "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def write_markdown(results_dir: str, kind: str, sections: list[str], notes: str = "") -> str:
    """Write `<kind>.md` and refresh `summary.md` from every `<kind>.md` present."""
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f"{kind}.md")
    with open(path, "w") as f:
        f.write(f"## llft bench {kind}\n\n{machine_line()}\n\n")
        for s in sections:
            f.write(s + "\n")
        if notes:
            f.write(notes.rstrip() + "\n")
    parts = sorted(p for p in os.listdir(results_dir) if p.endswith(".md") and p != "summary.md")
    with open(os.path.join(results_dir, "summary.md"), "w") as f:
        f.write("# llft benchmark summary\n\n")
        for p in parts:
            with open(os.path.join(results_dir, p)) as g:
                f.write(g.read() + "\n")
    return path


def plot(results_dir: str, name: str, title: str, xlabel: str, ylabel: str,
         series: dict[str, tuple[list, list]], logx: bool = False) -> str | None:
    """A line plot in the style of the LLFT paper's figures; None if matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = os.path.join(results_dir, f"{name}.png")
    fig.savefig(path)
    plt.close(fig)
    return path
