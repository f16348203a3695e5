"""Evaluation through vLLM: the engine is recorded in each result's settings, `stare-lab eval --engine
vllm` works end to end, and vLLM's sampling agrees with transformers' on the built-in model's held-out
problems within a paired test's tolerance."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
from engine_fixtures import SMALL
from engine_fixtures import paired_z as _paired_z

from stare_lab.config.run_config import compose, save_config
from stare_lab.evaluation import per_problem_counts
from stare_lab.evaluation.run_eval import evaluate_model
from stare_lab.models import load_model_and_tokenizer
from stare_lab.record import find_eval_result, read_eval_results
from stare_lab.run.runner import build_trainer
from stare_lab.training import vllm_engine

pytestmark = pytest.mark.vllm

N = 4  # samples per problem; 200 held-out problems


def _two_proportion_z(c1: int, c2: int, n: int) -> float:
    p = (c1 + c2) / (2 * n)
    se = math.sqrt(2 * p * (1 - p) / n)
    return (c1 - c2) / n / se if se > 0 else 0.0


def test_vllm_sampling_agrees_with_transformers_on_the_heldout_problems(tmp_path):
    cfg = compose(["method=full", "trainer.max_steps=1", *SMALL, f"eval.n={N}", "eval.benchmarks=[arithmetic]"])
    llm = build_trainer(cfg, tmp_path / "t").vllm_generation.llm  # the session's engine
    model, tok = load_model_and_tokenizer("builtin", dtype="float32")
    vllm_engine.load_policy(llm, model)  # earlier tests trained through this engine: back to the built-in model
    assert max(vllm_engine.weight_mismatch(llm, model).values()) == 0.0
    by = {}
    for name, sampler, tokenizer in (("vllm", llm, None), ("transformers", model, tok)):
        out = tmp_path / name
        result = evaluate_model(sampler, tokenizer, cfg, out, step=0)["arithmetic"]
        assert result["engine"] == name
        rows = [r for r in read_eval_results(out) if r["benchmark"] == "arithmetic"]
        assert len(rows) == 1 and rows[0]["engine"] == name
        import pandas as pd

        df = pd.read_parquet(out / "eval" / "arithmetic" / f"{result['settings_key']}.parquet")
        by[name] = per_problem_counts(df)
    c = {k: v["c"] / v["n"] for k, v in by.items()}
    z = _paired_z(c["vllm"], c["transformers"].loc[c["vllm"].index])
    z2 = _two_proportion_z(int(by["vllm"]["c"].sum()), int(by["transformers"]["c"].sum()), 200 * N)
    # shown with -s (capsys would take vLLM's stdout file descriptor away from it)
    print(f"\navg@{N}: vllm {c['vllm'].mean():.4f}, transformers {c['transformers'].mean():.4f}; ", end="")
    print(f"paired z = {z:.2f}, two-proportion z = {z2:.2f}")
    assert 0.0 < c["vllm"].mean() < 1.0  # a test that can tell a difference
    # |z| < 3.29: two-sided p = 0.001, so a correct sampler fails this test once in a thousand runs
    assert abs(z) < 3.29, (z, c["vllm"].mean(), c["transformers"].mean())


def test_cli_eval_engine_vllm_records_the_engine(tmp_path):
    """`stare-lab eval --engine vllm` in its own process (its own engine: one more start-up)."""
    run = tmp_path / "run"
    save_config(
        compose(["method=full", "logger=none", "eval.n=2", "eval.benchmarks=[arithmetic]"]), run / "config.yaml"
    )
    shutil.copytree(vllm_engine_path := _builtin_dir(), run / "final")
    assert (vllm_engine_path / "model.safetensors").is_file()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "stare_lab.cli", "eval", str(run), "--engine", "vllm"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = read_eval_results(run)
    assert result["engine"] == "vllm" and result["n"] == 2
    settings = {k: result[k] for k in ("n", "temperature", "top_p", "max_tokens", "verifier")}
    step = result["step"]
    assert find_eval_result(run, "arithmetic", {**settings, "engine": "vllm"}, step, final=True) is not None
    assert find_eval_result(run, "arithmetic", {**settings, "engine": "transformers"}, step, final=True) is None
    assert json.loads((run / "eval" / "arithmetic" / f"{result['settings_key']}.json").read_text())["engine"] == "vllm"


def _builtin_dir():
    from pathlib import Path

    import stare_lab.models

    return Path(stare_lab.models.__file__).parent / "builtin"
