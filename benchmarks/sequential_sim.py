"""Group-sequential claims where the truth is known: false verdicts, power and runs against the fixed design
(docs/statistics.md, "Sequential designs"; stare_lab/analysis/sequential.py).

    PYTHONPATH=. .venv/bin/python benchmarks/sequential_sim.py [--sweeps 10000] [--seed 0]

A sweep: 4 claims `x_i > full` against one shared baseline (5 arms), each run's score the arm's mean plus a
seed effect of sd 3 points; looks at 4, 8, 16, 32 seeds per arm, α = 0.05 over all claims, looks and both
verdicts, Holm's graph, each claim's target 3 points (the fixed design at 32 seeds detects it with power
about 0.9 at the first Holm level). Truths: no effect anywhere; every claim at its target; mixed (one null,
two at +3, one at −3 points). Statistics: "z" the known standard error; "t" Welch's t over seeds (each arm's
variance estimated) turned to z at equal tail probability; "z + problems" a fixed arm × problem part of sd 0.5
point per arm on top (information grows slower than seeds: the boundaries' seed-count correlation is then
conservative). The fixed design decides the same claims from the same runs at 32 seeds (the same graph,
one look). A false verdict is "supported" for a claim at or below its bound or "contradicted" for one at or
above it; FWER is the rate of sweeps with any.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stare_lab.analysis.sequential import (  # noqa: E402
    CONTRADICTED,
    FUTILE,
    SUPPORTED,
    SequentialClaim,
    SequentialDesign,
    simulate,
)

ALPHA = 0.05
LOOKS = (4, 8, 16, 32)
SD = 3.0  # points: one seed's score around its arm's mean
TARGET = 3.0  # points
ARMS = ("x0", "x1", "x2", "x3")
TRUTHS = {
    "no effect": (0.0, 0.0, 0.0, 0.0),
    "all at target": (TARGET, TARGET, TARGET, TARGET),
    "mixed": (0.0, TARGET, TARGET, -TARGET),
}
# (spending, futility threshold, conditional power under, statistic, problem sd, first futility look);
# new rows go last: each row's random seed is its index, so the earlier rows' numbers stay the same
DESIGNS = [
    ("obf", 0.1, "target", "z", 0.0, 1),
    ("obf", 0.1, "target", "t", 0.0, 1),
    ("obf", 0.1, "target", "z + problems", 0.5, 1),
    ("obf", 0.1, "estimate", "z", 0.0, 1),
    ("pocock", 0.1, "target", "z", 0.0, 1),
    ("obf", 0.1, "estimate", "z", 0.0, 2),
]


def claims() -> tuple[SequentialClaim, ...]:
    return tuple(SequentialClaim(a, TARGET, (a, "full")) for a in ARMS)


def false_verdicts(state: np.ndarray, effects: np.ndarray) -> np.ndarray:
    """Per sweep: any claim supported at or below its bound, or contradicted at or above it."""
    wrong = ((state == SUPPORTED) & (effects <= 0)) | ((state == CONTRADICTED) & (effects >= 0))
    return wrong.any(axis=1)


def power(state: np.ndarray, effects: np.ndarray, sign: float) -> float:
    """The rate of the right verdict over the claims whose effect has this sign (NaN where none has)."""
    kind = np.sign(effects) == sign
    if not kind.any():
        return math.nan
    right = SUPPORTED if sign > 0 else CONTRADICTED
    return float((state[:, kind] == right).mean())


def row(spend, futility, under, statistic, problem_sd, since, truth, sweeps, seed) -> dict:
    effects = np.array(TRUTHS[truth])
    means = {"full": 0.0, **dict(zip(ARMS, effects, strict=True))}
    stat = "t" if statistic == "t" else "z"
    kw = {"sweeps": sweeps, "seed": seed, "sd": SD, "problem_sd": problem_sd, "statistic": stat}
    seq = SequentialDesign(claims(), LOOKS, ALPHA, spend, futility=futility, futility_under=under, futility_from=since)
    fixed = SequentialDesign(claims(), (LOOKS[-1],), ALPHA, spend)
    s, f = simulate(seq, means, **kw), simulate(fixed, means, **kw)  # the same runs (same seed, same maximum)
    fwer = float(false_verdicts(s.state, effects).mean())
    return {
        "design": f"{spend}, futility {futility:g} under {under}" + (f" from look {since}" if since > 1 else ""),
        "statistic": statistic,
        "truth": truth,
        "fwer": fwer,
        "se": math.sqrt(fwer * (1 - fwer) / sweeps),
        "fixed_fwer": float(false_verdicts(f.state, effects).mean()),
        "power": [(power(s.state, effects, g), power(f.state, effects, g)) for g in (1.0, -1.0)],
        "futile": float((s.state == FUTILE)[:, effects == 0].mean()) if (effects == 0).any() else math.nan,
        "runs": float(s.runs.mean()),
        "runs_se": float(s.runs.std(ddof=1) / math.sqrt(sweeps)),
        "fixed_runs": float(f.runs.mean()),
    }


def cell(pair: tuple[float, float]) -> str:
    return "–" if math.isnan(pair[0]) else f"{pair[0]:.3f} / {pair[1]:.3f}"


def print_table(rows: list[dict]) -> bool:
    print(
        "| design | statistic | truth | false verdicts (FWER ± SE) | fixed FWER | power, claims at +target "
        "(seq / fixed) | power, claims at −target (seq / fixed) | null claims futile | runs: sequential / fixed "
        "(ratio) |"
    )
    print("|:--|:--|:--|--:|--:|--:|--:|--:|--:|")
    ok = True
    for r in rows:
        holds = r["fwer"] <= ALPHA + 2 * r["se"]
        ok &= holds
        futile = "–" if math.isnan(r["futile"]) else f"{r['futile']:.3f}"
        runs = f"{r['runs']:.1f} ± {r['runs_se']:.1f} / {r['fixed_runs']:.0f} ({r['runs'] / r['fixed_runs']:.3f})"
        print(
            f"| {r['design']} | {r['statistic']} | {r['truth']} | {r['fwer']:.4f} ± {r['se']:.4f}"
            f"{'' if holds else ' **over**'} | {r['fixed_fwer']:.4f} | {cell(r['power'][0])} | {cell(r['power'][1])} | "
            f"{futile} | {runs} |"
        )
    return ok


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sweeps", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    start = time.perf_counter()
    rows = [row(*d, truth, a.sweeps, a.seed + i) for i, d in enumerate(DESIGNS) for truth in TRUTHS]
    ok = print_table(rows)
    worst = max(rows, key=lambda r: r["fwer"] - ALPHA - 2 * r["se"])
    verdict = "holds" if ok else "FAILS"
    print(
        f"\ncheck: FWER ≤ α + 2·SE (α = {ALPHA}) {verdict} in all {len(rows)} rows (worst {worst['fwer']:.4f} "
        f"± {worst['se']:.4f}, {worst['design']}, {worst['statistic']}, {worst['truth']})"
    )
    print(f"{a.sweeps} sweeps per row (sequential and fixed on the same runs), {time.perf_counter() - start:.0f} s")
    print(f"machine: {machine()}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
