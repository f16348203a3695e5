"""compare_arms against rliable 1.2.0 and statsmodels on the same data: IQM difference, probability of
improvement (point values and stratified-bootstrap intervals) and Holm's adjusted p-values.

rliable 1.2.0 installs beside our stack but does not import in it: it pins arch < 8, arch 7.2 fails to import
under pandas 3.x (`deprecate_kwarg() missing 1 required positional argument`), and arch 8 refuses the
`random_state=None` that rliable passes to its bootstrap. The check therefore runs the reference packages from a
folder of their own, with the pandas arch 7.2 was built for in front of ours (stare_lab's analysis runs on
pandas 2.2 as well):

    pip install --no-deps --target /tmp/rliable_env rliable==1.2.0 arch==7.2.0 statsmodels==0.15.0 \\
        patsy absl-py pandas==2.2.3 pytz tzdata
    PYTHONPATH=/tmp/rliable_env:. .venv/bin/python benchmarks/coverage_crosscheck.py [--reps 20000]

Data: one simulated sweep (benchmarks/coverage_sim.py's model, "seed ≈ problems" balance) of a baseline and
four arms redrawn around shifts of +0, +2, +5 and −3 points, 5 paired seeds, three benchmarks. Point values
must agree to 1e-9; bootstrap intervals come from different random numbers (scipy's and arch's), so they
agree to the Monte-Carlo error of the percentiles, printed.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

from stare_lab.analysis import compare_arms
from stare_lab.analysis.compare import AVG_COLUMN


def _sim():
    spec = importlib.util.spec_from_file_location("coverage_sim", Path(__file__).with_name("coverage_sim.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EFFECTS = {"plus0": 0.0, "plus2": 0.02, "plus5": 0.05, "minus3": -0.03}


def sweep(seeds: int, rng: np.random.Generator) -> pd.DataFrame:
    """A baseline and one arm per EFFECTS entry: coverage_sim's two-arm sweeps, the arm shifted by its effect."""
    sim = _sim()
    frames = []
    base = None
    for name, effect in EFFECTS.items():
        data = sim.sweep(rng, seeds, sim.BALANCES["seed ≈ problems"], True)
        if base is None:
            base = data[data["arm"] == "full"]
            frames.append(base)
        arm = data[data["arm"] == "arm"].copy()
        p = np.clip(arm["correct"] / arm["n"] + effect, 0, 1)
        arm["correct"] = rng.binomial(arm["n"].to_numpy(), p.to_numpy())
        frames.append(arm.assign(arm=name))
    return pd.concat(frames, ignore_index=True)


def run_scores(data: pd.DataFrame, arm: str) -> np.ndarray:
    """rliable's layout: runs × tasks, each the run's avg@n on the benchmark (a fraction)."""
    rows = data[data["arm"] == arm].assign(score=lambda f: f["correct"] / f["n"])
    return rows.groupby(["seed", "benchmark"])["score"].mean().unstack("benchmark").to_numpy()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=20000, help="bootstrap resamples of rliable (arch)")
    p.add_argument("--seeds", type=int, default=5)
    a = p.parse_args()
    import warnings

    from rliable import library as rly
    from rliable import metrics

    warnings.filterwarnings("ignore", category=FutureWarning)  # arch 7.2 on rliable's random_state
    from statsmodels.stats.multitest import multipletests

    data = sweep(a.seeds, np.random.default_rng(0))
    ours = compare_arms(data, seed=0)
    avg = ours[ours["benchmark"] == AVG_COLUMN].set_index("arm")
    print(f"{len(EFFECTS)} arms × {a.seeds} seeds × 3 benchmarks; rliable {a.reps} resamples, ours 2000 (scipy)\n")
    print("| arm | view | compare_arms | rliable 1.2.0 | difference |")
    print("|:--|:--|--:|--:|--:|")
    worst_point, worst_bound = 0.0, 0.0
    y = run_scores(data, "full")
    for arm in EFFECTS:
        x = run_scores(data, arm)
        views = {
            "iqm_delta": (lambda u, v: np.array([metrics.aggregate_iqm(u) - metrics.aggregate_iqm(v)]) * 100),
            "prob_improvement": (lambda u, v: np.array([metrics.probability_of_improvement(u, v)])),
        }
        for view, fn in views.items():
            point, interval = rly.get_interval_estimates(
                {arm: [x, y]}, fn, reps=a.reps, random_state=np.random.RandomState(1)
            )
            ref = (float(point[arm][0]), float(interval[arm][0][0]), float(interval[arm][1][0]))
            got = (avg.loc[arm, view], avg.loc[arm, f"{view}_lo"], avg.loc[arm, f"{view}_hi"])
            worst_point = max(worst_point, abs(got[0] - ref[0]))
            width = ref[2] - ref[1]
            worst_bound = max(worst_bound, abs(got[1] - ref[1]) / width, abs(got[2] - ref[2]) / width)
            for label, g, r in zip(("point", "lower", "upper"), got, ref, strict=True):
                print(f"| {arm} | {view} {label} | {g:.4f} | {r:.4f} | {g - r:+.4f} |")
    for bench, rows in ours.groupby("benchmark"):
        ref_holm = multipletests(rows["p_value"].to_numpy(), method="holm")[1]
        gap = float(np.max(np.abs(rows["p_holm"].to_numpy() - ref_holm)))
        print(f"\nHolm on {bench}: largest |p_holm − statsmodels multipletests(holm)| = {gap:.1e}", end="")
        worst_point = max(worst_point, gap)
    print(
        f"\n\npoint values: largest difference {worst_point:.1e} (must be < 1e-9); bootstrap bounds: largest "
        f"difference {worst_bound:.1%} of rliable's interval width (Monte-Carlo error of the percentiles)"
    )
    assert worst_point < 1e-9, worst_point


if __name__ == "__main__":
    main()
