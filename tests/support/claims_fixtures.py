"""Simulated sweeps with set true effects, as frames (for the statistics) and as run records (for
`stare-lab claims`), for tests/analysis/test_claims*.py and benchmarks/claims_scale.py.

Scores: per problem a difficulty d_p ~ U(0.25, 0.75); arm a, seed s, problem p solves each of n
samples with probability clip(d_p + effect_a/100 + π_ap + σ_as + ε_asp, 0, 1), π ~ N(0, item_sd)
(the arm × problem part), σ ~ N(0, seed_sd), ε ~ N(0, noise_sd). Training metrics: each run's value
at every logged step is its final value plus a drift that vanishes at the last step; the final value is
N(mean_a, sd_a) over seeds.

Records: the sweep file's planned runs (stare_lab.plan.expand) get their resolved config.yaml, a
finished status.json, metrics.jsonl rows and eval/<benchmark>/<settings>.json + .parquet written by
stare_lab.record's own writers; the control arms (`base`: method base, no training metrics;
`random_reward`: full trained on random rewards) are planned runs of the expansion like the others.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from stare_lab.launchers.liveness import write_manifest
from stare_lab.plan.expand import expand_sweep
from stare_lab.plan.schema import parse_sweep
from stare_lab.record import new_status, write_eval_result, write_status

STEPS = (10, 20, 30, 40, 50)
EVAL = {"temperature": 1.0, "top_p": 0.7, "max_tokens": 24, "verifier": "exact", "engine": "transformers"}


def simulate_problems(
    effects: dict[str, float],
    rng: np.random.Generator,
    seeds: list[int] | int = 5,
    problems: int = 60,
    n: int = 32,
    seed_sd: float = 0.03,
    item_sd: float = 0.05,
    noise_sd: float = 0.05,
    benchmark: str = "arithmetic",
) -> pd.DataFrame:
    """compare_arms' per-problem frame for arms with true effects {arm: points over difficulty}."""
    seeds = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    difficulty = rng.uniform(0.25, 0.75, problems)
    frames = []
    for arm, effect in effects.items():
        item = rng.normal(0, item_sd, problems)
        p = difficulty + effect / 100 + item + rng.normal(0, seed_sd, (len(seeds), 1))
        p = p + rng.normal(0, noise_sd, (len(seeds), problems))
        correct = rng.binomial(n, np.clip(p, 0.0, 1.0))
        frames.append(
            pd.DataFrame(
                {
                    "arm": arm,
                    "seed": np.repeat(seeds, problems),
                    "benchmark": benchmark,
                    "problem": np.tile([f"p{i}" for i in range(problems)], len(seeds)),
                    "correct": correct.ravel(),
                    "n": n,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def simulate_training(
    finals: dict[str, tuple[float, float]],
    rng: np.random.Generator,
    seeds: list[int] | int = 5,
    metric: str = "entropy",
) -> pd.DataFrame:
    """collect_training's frame: {arm: (mean, sd) of the final value over seeds}."""
    seeds = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    rows = []
    for arm, (mean, sd) in finals.items():
        for seed, final in zip(seeds, rng.normal(mean, sd, len(seeds)), strict=True):
            for step in STEPS:
                drift = 0.5 * (STEPS[-1] - step) / STEPS[-1]
                rows.append({"arm": arm, "seed": seed, "run": f"{arm}-s{seed}", "step": step, "metric": metric,
                             "value": float(final + drift)})  # fmt: skip
    return pd.DataFrame(rows)


def sweep_file(folder: Path, name: str, arms: dict[str, dict], seeds: list[int], claims: list[dict], **extra) -> Path:
    """A sweep of one variant per arm ({label: overrides}, e.g. {"top_entropy": {"method": "top_entropy"}})
    on the built-in model, evaluated on its task with n = 32, and its claims."""
    data = {
        "name": name,
        "base": {"model": "builtin", "task": "arithmetic", "logger": "none", "overrides": {"trainer.max_steps": 50}},
        "variants": arms,
        "seeds": seeds,
        "eval": {"n": 32, "benchmarks": ["arithmetic"]},
        "output": str(folder / "runs"),
        **extra,
        "claims": claims,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


def write_records(path: Path, problems: pd.DataFrame, training: pd.DataFrame | None) -> list[Path]:
    """The records of the sweep at `path`: its planned runs, its controls' included (see the module docstring)."""
    spec = parse_sweep(yaml.safe_load(path.read_text()), where=str(path), folder=path.parent, reading=True)
    runs = [(r.config, r.run_dir, _label(r)) for r in expand_sweep(spec)]
    for cfg, run_dir, label in runs:
        _write_run(run_dir, cfg, label, problems, training)
    planned = [{"id": c["run"]["id"], "label": c["run"]["label"], "variant": c["run"]["variant"], "seed": c["seed"]}
               for c, _, _ in runs]  # fmt: skip
    digest = hashlib.sha256(path.read_text().encode()).hexdigest()
    write_manifest(spec.folder, spec.name, digest, runs=planned, launcher="local")  # as `sweep run` writes it
    return [d for _, d, _ in runs]


def _label(run) -> str:
    return run.variant or run.config["method"]["name"]


def _write_run(run_dir: Path, cfg: dict, arm: str, problems: pd.DataFrame, training: pd.DataFrame | None) -> None:
    seed = cfg["seed"]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    status = new_status(cfg["run"].get("label") or arm, cfg["run"].get("variant"), seed)
    write_status(run_dir, {**status, "state": "finished", "attempts": 1})
    steps = cfg["trainer"]["max_steps"]
    if training is not None and steps:
        mine = training[(training["arm"] == arm) & (training["seed"] == seed)]
        lines = [
            json.dumps({"step": int(step), "time": 1.7e9 + step, **dict(zip(g["metric"], g["value"], strict=True))})
            for step, g in mine.groupby("step")
        ]
        (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    for bench, rows in problems[(problems["arm"] == arm) & (problems["seed"] == seed)].groupby("benchmark"):
        n = int(rows["n"].iloc[0])
        result = {"benchmark": bench, "step": steps, "final": True, "n": n, **EVAL, "num_problems": len(rows),
                  "metrics": {f"avg@{n}": float((rows["correct"] / n).mean())}}  # fmt: skip
        samples = [
            {
                "problem_id": str(p),
                "sample_index": i,
                "answer": "1",
                "extracted": "1",
                "gold": "1",
                "correct": i < c,
                "length": 4,
            }  # fmt: skip
            for p, c in zip(rows["problem"], rows["correct"], strict=True)
            for i in range(n)
        ]
        write_eval_result(run_dir, result, samples)
