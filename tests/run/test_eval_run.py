"""Evaluation of a run: intermediate checkpoints during training (curves), `stare-lab eval` on a run dir,
each benchmark's own settings, and results under different settings side by side."""

from __future__ import annotations

import json

import pandas as pd
from omegaconf import OmegaConf

from stare_lab.cli import main
from stare_lab.config.run_config import compose, save_config
from stare_lab.evaluation import pass_at_k
from stare_lab.record import read_eval_results
from stare_lab.run.runner import execute

TINY = [
    "trainer.per_device_train_batch_size=8",
    "trainer.num_generations=4",
    "trainer.gradient_accumulation_steps=1",
    "trainer.max_steps=2",
    "trainer.save_steps=1",
    "logger=none",
    "task.heldout_size=12",
    "eval.n=4",
    "eval.batch_size=64",
]


def results(d) -> dict[str, dict]:
    return {r["settings_key"]: r for r in read_eval_results(d) if "settings_key" in r}


def test_intermediate_and_final_evaluation_records(tmp_path, capsys):
    cfg = compose(["method=top_entropy", "eval.every_steps=1", *TINY])
    d = tmp_path / "run"
    save_config(cfg, d / "config.yaml")
    execute(d)
    m = cfg.trainer.max_completion_length
    step1, final = f"step-1_n4_t1_p0.7_m{m}_exact", f"step-2_n4_t1_p0.7_m{m}_exact"
    found = results(d)
    assert set(found) == {step1, final}
    assert (found[step1]["step"], found[step1]["final"]) == (1, False) and (
        found[final]["step"],
        found[final]["final"],
    ) == (2, True)
    for key in (step1, final):
        result = found[key]
        rows = pd.read_parquet(d / "eval" / "arithmetic" / f"{key}.parquet")
        assert len(rows) == 12 * 4 and rows.groupby("problem_id").size().eq(4).all()
        columns = ["problem_id", "sample_index", "answer", "extracted", "gold", "correct", "length", "score"]
        assert list(rows.columns) == columns and rows["score"].tolist() == rows["correct"].astype(float).tolist()
        counts = rows.groupby("problem_id")["correct"].sum()
        assert result["metrics"]["avg@4"] == rows["correct"].mean()
        assert abs(result["metrics"]["pass@2"] - float(pass_at_k(4, counts.to_numpy(), 2).mean())) < 1e-12
        assert result["n"] == 4 and result["top_p"] == 0.7 and result["verifier"] == "exact"

    # `stare-lab eval` with another n adds a result beside the first and prints it
    assert main(["eval", str(d), "--n", "2"]) == 0
    assert "arithmetic: avg@2=" in capsys.readouterr().out
    assert set(results(d)) == {step1, final, f"step-2_n2_t1_p0.7_m{m}_exact"}
    assert json.loads((d / "eval" / "arithmetic" / f"{final}.json").read_text())["n"] == 4


def test_benchmark_settings_apply_unless_overridden_and_results_coexist(tmp_path, capsys):
    """eval.* left null: conf/benchmark/arithmetic.yaml's n = 32 applies; the command's --n 4 computes
    avg@4 beside it; repeating does nothing; --force replaces only the same settings."""
    cfg = OmegaConf.create(OmegaConf.to_container(compose(["method=full", *TINY]), resolve=True))
    cfg.eval.n = cfg.eval.temperature = cfg.eval.top_p = None
    d = tmp_path / "run"
    save_config(cfg, d / "config.yaml")
    execute(d)
    m = cfg.trainer.max_completion_length
    own = d / "eval" / "arithmetic" / f"step-2_n32_t1_p0.7_m{m}_exact.json"
    first = json.loads(own.read_text())
    assert first["n"] == 32 and "avg@32" in first["metrics"] and first["num_problems"] == 12

    assert main(["eval", str(d), "--n", "4", "--top-p", "0.9"]) == 0
    n4 = d / "eval" / "arithmetic" / f"step-2_n4_t1_p0.9_m{m}_exact.json"
    assert "avg@4" in json.loads(n4.read_text())["metrics"] and "top-p=0.9" in capsys.readouterr().out
    stamps = {p: p.stat().st_mtime_ns for p in (own, n4)}
    assert main(["eval", str(d), "--n", "4", "--top-p", "0.9"]) == 0  # already there: not redone
    assert {p: p.stat().st_mtime_ns for p in (own, n4)} == stamps
    assert main(["eval", str(d), "--n", "4", "--top-p", "0.9", "--force"]) == 0  # replaces only that one
    assert own.stat().st_mtime_ns == stamps[own] and n4.stat().st_mtime_ns > stamps[n4]
    assert json.loads(own.read_text()) == first

    capsys.readouterr()
    assert main(["eval", str(d), "--n", "0"]) == 2  # bad value: one line
    assert capsys.readouterr().err.strip() == "stare-lab: error: --n 0: expected a value ≥ 1"
    assert len(list((d / "eval" / "arithmetic").glob("*.json"))) == 2
