"""`stare-lab plot` of a sweep whose plan changed: the selection figures of the run that left its grid
are removed from the plot's folder, said in one line with the count; a user's own PNG there is kept,
even one named as a figure; the figures of the runs still planned stay as they were.

Real records (tests/support/claims_fixtures.py: the planned runs' configs, statuses and evaluations, as
runs write them) with kept batches (tests/support/synthetic_batch.py), `stare-lab plot` in a subprocess.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import yaml
from claims_fixtures import simulate_problems, write_records
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from sweep_fixtures import ROOT, sweep_env
from synthetic_batch import write_random_batch

from stare_lab.record.figure_stamps import read_stamp

ARMS = ["full", "stare", "top_entropy"]


def plot(path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "stare_lab.cli", "plot", str(path)]
    return subprocess.run(cmd, cwd=ROOT, env=sweep_env(), capture_output=True, text=True, timeout=300)


def write_sweep(path, arms: list[str]) -> None:
    data = {
        "name": "pl",
        "base": {"model": "builtin", "task": "arithmetic", "logger": "none", "overrides": {"trainer.max_steps": 5}},
        "grid": {"method": arms},
        "seeds": [0],
        "eval": {"n": 32, "benchmarks": ["arithmetic"]},
        "output": str(path.parent / "runs"),
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def users_png(path) -> bytes:
    """A PNG of the user's own (matplotlib's, without a stamp) at `path`; its bytes."""
    fig = Figure(figsize=(1, 1))
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png")
    return path.read_bytes()


def test_plot_removes_the_figures_of_a_run_that_left_the_plan_and_keeps_the_users(tmp_path):
    path = tmp_path / "pl.yaml"
    write_sweep(path, ARMS)
    problems = simulate_problems({"full": 0.0, "stare": 10.0, "top_entropy": 5.0}, np.random.default_rng(0), seeds=[0])
    runs = {d.name: d for d in write_records(path, problems, None)}
    arm_of = {d.name: yaml.safe_load((d / "config.yaml").read_text())["method"]["name"] for d in runs.values()}
    for k, run in enumerate(runs.values()):
        for step in (0, 5):
            write_random_batch(run, step, B=8, T=12, seed=k)
    out = tmp_path / "runs" / "pl" / "figures"
    out.mkdir()
    mine = {name: users_png(out / name) for name in ("notes.png", "selection-quadrant-my-run.png")}

    first = plot(path)
    assert first.returncode == 0, first.stderr
    assert "removed" not in first.stderr  # nothing stale yet: the user's PNGs bear no stamp
    figures = {run: [out / f"selection-{kind}-{run}.png" for kind in ("quadrant", "steps")] for run in runs}
    assert all(read_stamp(p) for paths in figures.values() for p in paths)
    kept = {p: p.read_bytes() for run, paths in figures.items() if arm_of[run] != "top_entropy" for p in paths}

    write_sweep(path, ["full", "stare"])  # top_entropy leaves the grid; its run folder stays (`sweep status` says so)
    second = plot(path)
    assert second.returncode == 0, second.stderr
    gone = next(run for run in runs if arm_of[run] == "top_entropy")
    assert not any(p.exists() for p in figures[gone])
    assert runs[gone].is_dir()  # the record is left alone: only the figures drawn from it go
    assert {p: p.read_bytes() for p in kept} == kept  # the planned runs' figures stay, kept as they were
    assert {name: (out / name).read_bytes() for name in mine} == mine
    removed = [line for line in second.stderr.splitlines() if "removed" in line]
    assert removed == [f"stare-lab plot: removed 2 selection figures of 1 run no longer in the plan from {out}"]
    lines = [line.split()[:5] for line in second.stdout.splitlines()]
    assert ["STARE", "quadrant", "views:", "2", "files"] in lines and [
        "selection",
        "over",
        "training:",
        "2",
        "files",
    ] in lines
