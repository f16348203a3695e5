"""Fixture run directories with known numbers, in the run record format (docs/run_record.md).

Sweep "fx": three arms × 2-3 seeds, two benchmarks, final and intermediate evaluations.

    final avg@32        arithmetic                 aime24
    full      s1..3     .50 .52 .54 → 52.0 ± 2.0   .10 .20 .30 → 20.0 ± 10.0
    stare     s1..3     .55 .56 .57 → 56.0 ± 1.0   .15 .20 .25 → 20.0 ± 5.0
    rsi_band[0.5,1] s1,2 .48 .50    → 49.0 ± 1.4   .25 .35     → 30.0 ± 7.1
    Avg.: full 36.0, stare 38.0 (+2.0), rsi_band[0.5,1] 39.5 (+3.5)

Intermediate evaluations (eval/step-50/) carry a different value (0.99) so a table that leaked
them would show. Training metrics: reward = REWARD_BASE[rule] + 0.01·step + 0.001·seed at steps
10..50.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

SWEEP = "fx"
BENCHMARKS = ("arithmetic", "aime24")
FINAL_STEP = 50
STEPS = (10, 20, 30, 40, 50)
# (method, variant, seed) → {benchmark: avg@32}
AVG = {
    ("full", None, 1): {"arithmetic": 0.50, "aime24": 0.10},
    ("full", None, 2): {"arithmetic": 0.52, "aime24": 0.20},
    ("full", None, 3): {"arithmetic": 0.54, "aime24": 0.30},
    ("stare", None, 1): {"arithmetic": 0.55, "aime24": 0.15},
    ("stare", None, 2): {"arithmetic": 0.56, "aime24": 0.20},
    ("stare", None, 3): {"arithmetic": 0.57, "aime24": 0.25},
    ("rsi_band", "[0.5,1]", 1): {"arithmetic": 0.48, "aime24": 0.25},
    ("rsi_band", "[0.5,1]", 2): {"arithmetic": 0.50, "aime24": 0.35},
}
SETTINGS = {
    "arithmetic": {
        "n": 32,
        "temperature": 1.0,
        "top_p": 0.7,
        "max_tokens": 256,
        "verifier": "exact",
        "num_problems": 4,
    },
    "aime24": {
        "n": 32,
        "temperature": 1.0,
        "top_p": 0.7,
        "max_tokens": 4096,
        "verifier": "math_verify",
        "num_problems": 30,
    },
}
KS = (1, 2, 4, 8, 16, 32)
REWARD_BASE = {"full": 0.3, "stare": 0.4, "rsi_band": 0.2, "ict": 0.25}  # base: no training, no metrics
RULE_METRICS = {
    "full": {},
    "ict": {},
    "stare": {"rule/gate": 0.5},
    "rsi_band": {"rule/kept_frac": 0.6, "rule/low_frac": 0.1, "rule/high_frac": 0.3},
}


def run_id(method: str, variant: str | None, seed: int) -> str:
    return f"{method}{'-b' if variant else ''}-s{seed}"


def pass_at(avg: float, k: int) -> float:
    """Fixture pass@k: any increasing function of k with pass@1 = avg@32 will do."""
    return 1.0 - (1.0 - avg) ** k


def _write_eval(eval_dir: Path, benchmark: str, avg: float, step: int, settings: dict) -> None:
    eval_dir.mkdir(parents=True, exist_ok=True)
    n, num = settings["n"], settings["num_problems"]
    metrics = {f"avg@{n}": avg, f"avg@{n}_ci": [avg - 0.05, avg + 0.05], f"maj@{n}": min(avg + 0.02, 1.0)}
    metrics.update({f"pass@{k}": pass_at(avg, k) for k in KS})
    record = {"benchmark": benchmark, "step": step, **settings, "metrics": metrics}
    (eval_dir / f"{benchmark}.json").write_text(json.dumps(record))
    correct = round(avg * n * num)
    rows = [
        {
            "problem_id": str(p),
            "sample_index": s,
            "answer": "\\boxed{1}",
            "extracted": "1",
            "gold": "1",
            "correct": p * n + s < correct,
            "length": 10,
        }
        for p in range(num)
        for s in range(n)
    ]
    pd.DataFrame(rows).to_parquet(eval_dir / f"{benchmark}.parquet")


def write_run(
    root: Path,
    method: str,
    variant: str | None,
    seed: int,
    *,
    state: str = "finished",
    evals: dict[str, float] | None = None,
    settings: dict | None = None,
    truncate_metrics: bool = False,
    extra_config: dict | None = None,
) -> Path:
    """One run directory; `evals=None` writes no eval/ (a run not yet evaluated)."""
    rid = run_id(method, variant, seed)
    run_dir = root / SWEEP / rid
    run_dir.mkdir(parents=True)
    params = {"low": 0.5, "high": 1.0} if method == "rsi_band" else {}
    config = {
        "seed": seed,
        "model": {"name_or_path": "builtin"},
        "method": {"name": method, "params": params},
        "trainer": {"learning_rate": 1e-6, "output_dir": str(run_dir), "seed": seed},
        "logger": {"project": "stare_lab"},
        "run": {
            "sweep": SWEEP,
            "id": rid,
            "label": f"method={method} seed={seed}",
            **({"variant": variant} if variant else {}),
        },
    }
    for key, value in (extra_config or {}).items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "status.json").write_text(json.dumps({"state": state, "attempts": 1, "error": None}))
    lines = []
    for step in STEPS if method != "base" else ():
        row = {
            "step": step,
            "time": 1.7e9 + step,
            "reward": REWARD_BASE[method] + 0.01 * step + 0.001 * seed,
            "entropy": 1.0 - 0.01 * step,
            "tokens/selected_frac": 0.2 if method != "full" else 1.0,
            "tokens/trained_frac": 0.2 if method != "full" else 1.0,
            "tokens/touched_frac": 0.8 if method != "full" else 0.0,
            **{k: v + 0.001 * step for k, v in RULE_METRICS[method].items()},
        }
        lines.append(json.dumps(row))
    text = "\n".join(lines) + "\n"
    if truncate_metrics:
        text += json.dumps({"step": 60, "reward": 0.9})[:15]  # a crash mid-write
    if lines:
        (run_dir / "metrics.jsonl").write_text(text)
    for benchmark, avg in (evals or {}).items():
        s = (settings or SETTINGS)[benchmark]
        _write_eval(run_dir / "eval", benchmark, avg, FINAL_STEP, s)
        _write_eval(run_dir / "eval" / "step-30", benchmark, 0.99, 30, s)
    return run_dir


def write_sweep(root: Path, *, incomplete: bool = False) -> Path:
    """The complete sweep; `incomplete` adds a failed `ict` run with no eval and truncates the
    last metrics line of full-s3 (the table numbers stay those of the docstring)."""
    for (method, variant, seed), evals in AVG.items():
        truncate = incomplete and (method, seed) == ("full", 3)
        write_run(root, method, variant, seed, evals=evals, truncate_metrics=truncate)
    if incomplete:
        write_run(root, "ict", None, 1, state="failed", evals=None)
    return root / SWEEP


def write_arms(root: Path, arms: dict, benchmark: str = "aime24") -> Path:
    """A sweep of `arms` {(method, variant): one avg per seed, seeds 1, 2, ...}, evaluated on one benchmark."""
    for (method, variant), avgs in arms.items():
        for seed, avg in enumerate(avgs, start=1):
            write_run(root, method, variant, seed, evals={benchmark: avg})
    return root / SWEEP
