"""compare_arms over 21 arms × 5 seeds × 500 problems (one benchmark): wall time, best of 3 (target ≤ 2 s).

PYTHONPATH=. python benchmarks/compare_arms.py [--arms 21] [--seeds 5] [--problems 500] [--benchmarks 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from stare_lab.analysis import compare_arms, seeds_needed


def sweep(arms: int, seeds: int, problems: int, benchmarks: int, n: int = 32, rng_seed: int = 0) -> pd.DataFrame:
    """Binomial counts around a per-problem difficulty, with seed effects of ~4 points."""
    rng = np.random.default_rng(rng_seed)
    frames = []
    for b in range(benchmarks):
        difficulty = rng.uniform(0.05, 0.95, problems)
        for a in range(arms):
            p = difficulty[None, :] + rng.normal(0, 0.04, (seeds, 1)) + rng.normal(0, 0.05, (seeds, problems))
            correct = rng.binomial(n, np.clip(p, 0.0, 1.0))
            frames.append(
                pd.DataFrame(
                    {
                        "arm": "full" if a == 0 else f"arm{a:02d}",
                        "seed": np.repeat(np.arange(seeds), problems),
                        "benchmark": f"bench{b}",
                        "problem": np.tile(np.arange(problems), seeds),
                        "correct": correct.ravel(),
                        "n": n,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arms", type=int, default=21)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--problems", type=int, default=500)
    p.add_argument("--benchmarks", type=int, default=1)
    a = p.parse_args()
    data = sweep(a.arms, a.seeds, a.problems, a.benchmarks)
    compare_arms(data)  # warm-up: imports, first calls
    times = []
    for _ in range(3):
        start = time.perf_counter()
        out = compare_arms(data)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    seeds_needed(out)
    t_seeds = time.perf_counter() - start
    print(
        f"compare_arms: {a.arms} arms × {a.seeds} seeds × {a.problems} problems × {a.benchmarks} benchmark(s) "
        f"({len(data)} rows): best {min(times):.3f} s, worst {max(times):.3f} s of 3 (target ≤ 2 s); "
        f"seeds_needed: {t_seeds:.3f} s"
    )


if __name__ == "__main__":
    main()
