"""`stare-lab claims` over a sweep of 500 simulated runs: the whole command's wall time (target ≤ 5 s).

    PYTHONPATH=. .venv/bin/python benchmarks/claims_scale.py [--dir /tmp/stare_claims_scale] [--reps 3]
        [--arms 18] [--seeds 25] [--problems 200] [--steps 100]

The sweep: 18 arms (full, 15 other rules, and the controls base and random_reward) × 25 seeds = 450
trained runs + 25 base + 25 random-reward runs = 500 records, each with a resolved config.yaml, a
finished status.json, a metrics.jsonl of `--steps` rows of 40 metrics (entropy and the gradient cosine
among them) and an avg@32 evaluation of `--problems` problems (eval/<benchmark>/<settings>.json and its
per-sample parquet, 32 rows per problem), written by the record's own writers
(tests/support/claims_fixtures.py), and 14 claims of every form and quantity. The records are written
once into --dir and reused. Each repetition is a fresh `stare-lab claims` process; the median is
reported with the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

from claims_fixtures import simulate_problems, sweep_file, write_records  # noqa: E402

RULES = ["full", "top_entropy", "low_entropy", "random", "anchor", "explorer", "stare", "rsi_band", "ict", "gmts",
         "opefo", "clip_cov", "kl_cov", "archer", "entropy_adv", "adv_reweight", "lopti", "ce_gppo"]  # fmt: skip
SRC = {"arxiv": "2506.01939", "where": "Table 2", "number": "+7.71 AIME24", "model": "Qwen3-32B"}
SCORE = {"score": "avg@32", "benchmarks": ["arithmetic"]}
CLAIMS = [
    {"id": "c_sup", "form": "superiority", "a": "stare", "b": "full", "quantity": SCORE},
    {"id": "c_inf", "form": "inferiority", "a": "low_entropy", "b": "full", "quantity": SCORE},
    {"id": "c_ni", "form": "non_inferiority", "a": "top_entropy", "b": "full", "margin": "2 points", "quantity": SCORE},
    {"id": "c_eq", "form": "equivalence", "a": "random", "b": "full", "margin": "3 points", "quantity": SCORE},
    {"id": "c_rg", "form": "retained_gain", "a": "random", "b": "full", "base": "base", "fraction": 0.5,
     "quantity": SCORE},
    {"id": "c_gb", "form": "gain_below", "a": "random_reward", "b": "full", "base": "base", "fraction": 0.5,
     "quantity": SCORE},
    {"id": "c_pass", "form": "superiority", "a": "base", "b": "full", "quantity": {"score": "pass@32"}},
    {"id": "c_ict", "form": "superiority", "a": "ict", "b": "full", "quantity": {"score": "pass@4"}},
    {"id": "c_spread", "form": "superiority", "a": "explorer", "b": "anchor", "quantity": {"spread": "avg@32"}},
    {"id": "c_cos", "form": "superiority", "a": "anchor", "b": "explorer",
     "quantity": {"metric": "geometry/cosine", "at": "last"}},
    {"id": "c_ent1", "form": "superiority", "a": "opefo", "b": "full",
     "quantity": {"metric": "entropy", "last_steps": 20}},
    {"id": "c_ent2", "form": "superiority", "a": "clip_cov", "b": "full",
     "quantity": {"metric": "entropy", "steps": [50, 100]}},
    {"id": "c_ent3", "form": "superiority", "a": "kl_cov", "b": "full",
     "quantity": {"metric": "entropy", "at": "last"}},
    {"id": "c_gmts", "form": "superiority", "a": "gmts", "b": "top_entropy", "quantity": SCORE},
]  # fmt: skip


def training(arms: list[str], seeds: list[int], steps: int, rng) -> object:
    import pandas as pd

    metrics = ["entropy", "geometry/cosine"] + [f"filler/m{i:02d}" for i in range(38)]
    rows = []
    for arm in arms:
        for seed in seeds:
            values = rng.normal(0.5, 0.05, (steps, len(metrics)))
            for s in range(steps):
                rows += [(arm, seed, s + 1, m, float(v)) for m, v in zip(metrics, values[s], strict=True)]
    return pd.DataFrame(rows, columns=["arm", "seed", "step", "metric", "value"])


def build(folder: Path, n_arms: int, n_seeds: int, problems: int, steps: int) -> Path:
    path = folder / "scale.yaml"
    if (folder / "done").is_file():
        return path
    rng = np.random.default_rng(0)
    rules = RULES[: n_arms - 2]
    seeds = list(range(n_seeds))
    known = {*rules, "base", "random_reward"}
    claims = [{**c, "source": SRC} for c in CLAIMS if {c["a"], c["b"]} <= known]
    variants = {r: {"method": r} for r in rules}
    path = sweep_file(folder, "scale", variants, seeds, claims, controls=["base", "random_reward"])
    geometry = f"trainer.max_steps: {steps}\n    trainer.grad_geometry_every: 1"
    text = path.read_text().replace("trainer.max_steps: 50", geometry)
    path.write_text(text)
    effects = {r: float(rng.normal(10, 2)) for r in rules} | {"base": 0.0, "random_reward": 3.0}
    frame = simulate_problems(effects, rng, seeds=seeds, problems=problems)
    write_records(path, frame, training([*rules, "random_reward"], seeds, steps, rng))
    (folder / "done").write_text("ok")
    return path


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", type=Path, default=Path("/tmp/stare_claims_scale"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--arms", type=int, default=20)
    p.add_argument("--seeds", type=int, default=25)
    p.add_argument("--problems", type=int, default=200)
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    path = build(a.dir, a.arms, a.seeds, a.problems, a.steps)
    print(f"records: {time.perf_counter() - start:.1f} s to write (or reuse) under {a.dir}")
    stare_lab = str(Path(sys.executable).parent / "stare-lab")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    times, cpu = [], []
    for _ in range(a.reps):
        start, used = time.perf_counter(), _children_cpu()
        proc = subprocess.run([stare_lab, "claims", str(path)], capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - start)
        cpu.append(_children_cpu() - used)
        if proc.returncode != 0:
            raise SystemExit(f"stare-lab claims failed: {proc.stderr[-2000:]}")
    runs = sum(1 for _ in (a.dir / "runs" / "scale").glob("*/status.json"))
    print(proc.stdout.splitlines()[0])
    print(
        f"stare-lab claims over {runs} runs: wall median {statistics.median(times):.2f} s, best {min(times):.2f} s "
        f"of {a.reps} (target ≤ 5 s); CPU median {statistics.median(cpu):.2f} s; {platform.machine()}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, Python {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
