"""How often compare_arms' 95% interval excludes 0 when there is no difference (it should: 5%).

Simulated sweeps of two arms (full and arm, the same rule: no true difference) on three benchmarks of
30, 40 and 80 problems, n = 32 samples per problem, for 2, 3 and 5 seeds (paired: the arms share the
seeds, as a sweep's arms do) and several balances of seed and problem variance. Each sweep is one
`compare_arms` call, as `stare-lab table` makes it; the rate is over sweeps, for the "Avg." row and
for the per-benchmark rows (pooled over the three benchmarks).

    PYTHONPATH=. python benchmarks/coverage_sim.py [--sweeps 400] [--seeds 2 3 5] [--unpaired] [--seed 0]
                                                   [--satterthwaite-everywhere]

--satterthwaite-everywhere: Satterthwaite's df at 2 seeds too (compare_arms before issue 27.6), for the
comparison docs/statistics.md shows.

The score of arm a, seed s on problem p of benchmark b is the probability of a correct sample,

    difficulty[b, p] + arm_problem[a, b, p] + seed[a, s] + seed_bench[a, s, b] + interaction[a, s, b, p]

clipped to [0, 1], then c ~ Binomial(32, ·). difficulty ~ U(0.15, 0.85) is shared by the arms (the same
problems); the other terms are normal with the standard deviations of each balance (points, below).
`seed share` is the part of Var(D) of the Avg. row that the seed terms make at 2 seeds (analytic,
binomial noise at p = 0.5): where it is near 1/2 the 1-df seed term and the problem terms are comparable.

Default: 400 sweeps per cell (binomial SE of a 5% rate: 1.1 points), about 100 s on 2 cores.
docs/statistics.md publishes a run with --sweeps 2000.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import numpy as np
import pandas as pd

from stare_lab.analysis import compare_arms
from stare_lab.analysis.compare import AVG_COLUMN

N = 32  # samples per problem
PROBLEMS = (30, 40, 80)  # AIME-, AMC- and MATH-500-slice-sized benchmarks
# name: (seed sd, seed × benchmark sd, arm × problem sd, seed × problem interaction sd), in points
BALANCES = {
    "problems dominate": (0.0, 0.0, 15.0, 3.0),
    "problems > seed": (0.0, 0.0, 8.0, 3.0),
    "seed ≈ problems": (1.0, 0.5, 8.0, 3.0),
    "seed > problems": (1.0, 0.5, 4.0, 3.0),
    "seed dominates": (5.0, 2.0, 1.0, 3.0),
}


def seed_share(balance: tuple[float, float, float, float], seeds: int = 2) -> float:
    """The seed terms' share of Var(D) on the Avg. row (paired: Var of the per-seed differences)."""
    seed_sd, bench_sd, problem_sd, inter_sd = (x / 100 for x in balance)
    k = len(PROBLEMS)
    binom = 0.25 / N
    # per-seed difference of the equally weighted mean over benchmarks: 2 × each arm's variance
    seed_var = 2 * (seed_sd**2 + bench_sd**2 / k)
    noise_var = 2 * sum((inter_sd**2 + binom) / p for p in PROBLEMS) / k**2  # ε over problems, per seed
    problem_var = 2 * sum(problem_sd**2 / p for p in PROBLEMS) / k**2
    seed_term = (seed_var + noise_var) / seeds  # what the seeds' spread estimates, with seeds − 1 df
    return seed_term / (seed_term + problem_var)


def sweep(rng: np.random.Generator, seeds: int, balance: tuple[float, ...], paired: bool) -> pd.DataFrame:
    """One simulated sweep: two arms without a difference, per-problem counts (compare_arms' input)."""
    seed_sd, bench_sd, problem_sd, inter_sd = (x / 100 for x in balance)
    seed = rng.normal(0, seed_sd, (2, seeds))
    frames = []
    for b, problems in enumerate(PROBLEMS):
        difficulty = rng.uniform(0.15, 0.85, problems)
        p = (
            difficulty[None, None, :]
            + rng.normal(0, problem_sd, (2, 1, problems))
            + (seed + rng.normal(0, bench_sd, (2, seeds)))[:, :, None]
            + rng.normal(0, inter_sd, (2, seeds, problems))
        )
        correct = rng.binomial(N, np.clip(p, 0.0, 1.0))
        a, s, q = np.meshgrid(np.arange(2), np.arange(seeds), np.arange(problems), indexing="ij")
        frames.append(
            pd.DataFrame(
                {
                    "arm": np.where(a == 1, "arm", "full").ravel(),
                    "seed": (s if paired else s + a * seeds).ravel(),
                    "benchmark": f"b{b}",
                    "problem": q.ravel(),
                    "correct": correct.ravel(),
                    "n": N,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def excluded(rows: pd.DataFrame) -> np.ndarray:
    """Whether each row's interval excludes 0 (rows without an interval count as not excluding it)."""
    lo, hi = rows["ci_lo"].to_numpy(float), rows["ci_hi"].to_numpy(float)
    return (lo > 0) | (hi < 0)


def cell(sweeps: int, seeds: int, balance: tuple[float, ...], paired: bool, rng: np.random.Generator) -> dict:
    avg, per_bench, bold, widths, intervals = [], [], [], [], 0
    for _ in range(sweeps):
        out = compare_arms(sweep(rng, seeds, balance, paired), views=False)
        a, b = out[out["benchmark"] == AVG_COLUMN], out[out["benchmark"] != AVG_COLUMN]
        avg.append(excluded(a)[0])
        per_bench.extend(excluded(b))
        bold.append(bool(a["verdict"].isin(["better", "worse"]).iloc[0]))
        intervals += int(np.isfinite(a["ci_lo"]).iloc[0])
        widths.append(float((a["ci_hi"] - a["ci_lo"]).iloc[0]))
    return {
        "avg": float(np.mean(avg)),
        "per_benchmark": float(np.mean(per_bench)),
        "bold": float(np.mean(bold)),
        "with_interval": intervals / sweeps,
        "median_width": float(np.nanmedian(widths)) if intervals else math.nan,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweeps", type=int, default=400, help="simulated sweeps per (seeds, balance) cell")
    p.add_argument("--seeds", type=int, nargs="+", default=[2, 3, 5])
    p.add_argument("--unpaired", action="store_true", help="the arms on other seeds (other data orders)")
    p.add_argument("--seed", type=int, default=0, help="of the simulation's random numbers")
    p.add_argument("--satterthwaite-everywhere", action="store_true", help="Satterthwaite's df at 2 seeds too")
    a = p.parse_args()
    if a.satterthwaite_everywhere:
        import stare_lab.analysis.compare as compare

        compare.MIN_SATTERTHWAITE_SEED_DF = 1
    rng = np.random.default_rng(a.seed)
    start = time.perf_counter()
    print(
        f"{a.sweeps} no-effect sweeps per cell, {'unpaired' if a.unpaired else 'paired'} seeds, problems "
        f"{'/'.join(map(str, PROBLEMS))}, n = {N}; rate at which the 95% interval excludes 0 (target 5%)"
        f"{'; Satterthwaite df at 2 seeds too' if a.satterthwaite_everywhere else ''}\n"
    )
    print("| seeds | balance (sd in points: seed, seed×bench, arm×problem, seed×problem) | seed share at 2 seeds "
          "| Avg. row | per benchmark | Avg. bold | Avg. median width |")  # fmt: skip
    print("|--:|:--|--:|--:|--:|--:|--:|")
    for seeds in a.seeds:
        for name, balance in BALANCES.items():
            r = cell(a.sweeps, seeds, balance, not a.unpaired, rng)
            sds = ", ".join(f"{x:g}" for x in balance)
            width = f"{r['median_width']:.1f}" if np.isfinite(r["median_width"]) else "–"
            if r["with_interval"] < 1:
                width += f" ({r['with_interval']:.0%} with an interval)"
            print(
                f"| {seeds} | {name} ({sds}) | {seed_share(balance):.2f} | {r['avg']:.1%} | "
                f"{r['per_benchmark']:.1%} | {r['bold']:.1%} | {width} |",
                flush=True,
            )
    print(
        f"\n{time.perf_counter() - start:.0f} s on {cpu_name()} ({os.cpu_count()} cores), "
        f"{platform.python_implementation()} {platform.python_version()}, numpy {np.__version__}"
    )


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
