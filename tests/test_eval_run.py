"""Evaluation of a run: intermediate checkpoints during training (curves) and `stare-lab eval` on a run dir."""
from __future__ import annotations

import json

import pandas as pd

from stare_lab.cli import main
from stare_lab.config import compose, save_config
from stare_lab.evaluation import pass_at_k
from stare_lab.runner import execute

TINY = ["trainer.per_device_train_batch_size=8", "trainer.num_generations=4", "trainer.gradient_accumulation_steps=1",
        "trainer.max_steps=2", "trainer.save_steps=1", "logger=none", "task.heldout_size=12", "eval.n=4",
        "eval.batch_size=64"]


def test_intermediate_and_final_evaluation_records(tmp_path, capsys):
    cfg = compose(["method=top_entropy", "eval.every_steps=1", *TINY])
    d = tmp_path / "run"
    save_config(cfg, d / "config.yaml")
    execute(d)
    step1 = json.loads((d / "eval" / "step-1" / "arithmetic.json").read_text())
    final = json.loads((d / "eval" / "arithmetic.json").read_text())
    assert step1["step"] == 1 and final["step"] == 2
    for result, parquet in ((step1, d / "eval" / "step-1" / "arithmetic.parquet"), (final, d / "eval" / "arithmetic.parquet")):
        rows = pd.read_parquet(parquet)
        assert len(rows) == 12 * 4 and rows.groupby("problem_id").size().eq(4).all()
        assert list(rows.columns) == ["problem_id", "sample_index", "answer", "extracted", "gold", "correct", "length"]
        counts = rows.groupby("problem_id")["correct"].sum()
        assert result["metrics"]["avg@4"] == rows["correct"].mean()
        assert abs(result["metrics"]["pass@2"] - float(pass_at_k(4, counts.to_numpy(), 2).mean())) < 1e-12
        assert result["n"] == 4 and result["top_p"] == 0.7 and result["verifier"] == "exact"

    # `stare-lab eval` with another n re-evaluates only when forced, and prints the metrics
    assert main(["eval", str(d), "--n", "2", "--force"]) == 0
    assert "arithmetic: avg@2=" in capsys.readouterr().out
    assert json.loads((d / "eval" / "arithmetic.json").read_text())["n"] == 2
