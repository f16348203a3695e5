"""The claims' tests where the truth is known: verdict rates over simulated sweeps against the rates the
power module predicts (docs/statistics.md, "Claims"; the same simulation as tests/analysis/test_claims_stats.py).

    PYTHONPATH=. .venv/bin/python benchmarks/claims_sim.py [--sweeps 1000]

Held-out scores: `x` against `full` on one benchmark (tests/support/claims_fixtures.simulate_problems:
60 problems, n = 32, seed sd 3 points, arm × problem sd 5, seed × problem sd 5), 4 seeds per arm, one
claim per sweep (Holm's level is α = 0.05). Training metric: 5 seeds per arm, sd 0.1, Welch. Spread: 6
seeds, Brown-Forsythe. Retained gain: base 0, full +10, random +5 points (the ratio exactly at f = 0.5).
The predicted rate is the power module's (power_at, welch_power) at the true effect and the design's
variance components (each sweep's estimates pooled).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from claims_fixtures import simulate_problems  # noqa: E402

from stare_lab.analysis.hypotheses import combine, score_tables, seed_outcome  # noqa: E402
from stare_lab.analysis.power import power_at, welch_power  # noqa: E402
from stare_lab.analysis.verdicts import decide  # noqa: E402
from stare_lab.plan.claims import parse_claims  # noqa: E402

ALPHA = 0.05


def _claim(form: str, **extra):
    item = {"id": "c", "source": "own", "form": form, "a": "x", "b": "full",
            "quantity": {"score": "avg@32", "benchmarks": ["arithmetic"]}, **extra}  # fmt: skip

    def fail(key, msg):
        raise ValueError(f"{key}: {msg}")

    return parse_claims([item], fail)[0]


def scores(effect: float, sweeps: int, rng, seeds: int = 4) -> tuple[dict[str, float], float]:
    c = _claim("superiority")
    verdicts, parts = [], []
    for _ in range(sweeps):
        frame = simulate_problems({"full": 10.0, "x": 10.0 + effect}, rng, seeds=seeds, problems=60)
        verdicts.append(decide([c], frame, None)["verdict"].iloc[0])
        comb = combine(score_tables(frame, c), {"x": 1.0, "full": -1.0})
        parts.append((comb["var_problem"], comb["var_seed_arm"] + comb["var_seed_base"], comb["df_problem"]))
    vp, vs, dfp = np.mean(parts, axis=0)
    predicted = float(power_at(abs(effect), 1e4 * vp, 1e4 * vs, seeds, dfp, 1 - 2 * ALPHA)) if effect else ALPHA
    v = np.array(verdicts)
    return {k: float((v == k).mean()) for k in ("supported", "contradicted", "undecided")}, predicted


def welch(effect: float, sweeps: int, rng) -> tuple[float, float]:
    c = _claim("superiority", quantity={"metric": "entropy", "at": "last"})
    hits = sum(
        seed_outcome(c, {"x": rng.normal(1 + effect, 0.1, 5), "full": rng.normal(1.0, 0.1, 5)}).p_support < ALPHA
        for _ in range(sweeps)
    )
    return hits / sweeps, float(welch_power(effect, [0.01, 0.01], 5, ALPHA)) if effect else ALPHA


def spread(sd: float, sweeps: int, rng) -> float:
    c = _claim("superiority", quantity={"spread": "avg@32"})
    return (
        sum(
            seed_outcome(c, {"x": rng.normal(0.5, sd, 6), "full": rng.normal(0.5, 0.02, 6)}, spread=True).p_support
            < ALPHA
            for _ in range(sweeps)
        )
        / sweeps
    )


def retained(sweeps: int, rng) -> float:
    c = _claim("retained_gain", base="base", fraction=0.5)
    return (
        sum(
            decide([c], simulate_problems({"base": 0.0, "full": 10.0, "x": 5.0}, rng, seeds=4), None)["verdict"].iloc[0]
            == "supported"
            for _ in range(sweeps)
        )
        / sweeps
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sweeps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    start = time.perf_counter()
    print("| design | truth | verdict counted | observed | predicted |\n|:--|:--|:--|--:|--:|")
    for effect in (0.0, 2.0, 4.0, 6.0, -4.0):
        rates, predicted = scores(effect, a.sweeps, rng)
        counted = "contradicted" if effect < 0 else "supported"
        print(f"| x > full, avg@32, 4 seeds × 60 problems | {effect:+g} points | {counted} | "
              f"{rates[counted]:.3f} | {predicted:.3f} |")  # fmt: skip
    for effect in (0.0, 0.1, 0.15):
        observed, predicted = welch(effect, a.sweeps, rng)
        print(f"| x > full, a training metric, Welch, 5 seeds | {effect:+g} (sd 0.1) | supported | {observed:.3f} | "
              f"{predicted:.3f} |")  # fmt: skip
    for sd in (0.02, 0.06, 0.10):
        print(f"| seed spread x > full, Brown-Forsythe, 6 seeds | SD {sd:g} vs 0.02 | supported | "
              f"{spread(sd, a.sweeps, rng):.3f} | {'0.050 (level)' if sd == 0.02 else '–'} |")  # fmt: skip
    print(f"| x − base ≥ ½ (full − base), 4 seeds | ratio exactly ½ | supported | {retained(a.sweeps, rng):.3f} | "
          "0.050 (level) |")  # fmt: skip
    print(f"\n{a.sweeps} sweeps per row, {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
