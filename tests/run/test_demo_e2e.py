"""The demo end to end, reduced (2 rules, 1 seed, 2 steps, n = 4): sweep → eval → table and plots."""

from __future__ import annotations

import struct

import pandas as pd
import yaml

from stare_lab.cli import main


def test_reduced_demo_produces_table_and_plots(tmp_path, capsys):
    sweep = {
        "name": "demo_ci",
        "base": {
            "model": "builtin",
            "task": "arithmetic",
            "trainer": "cpu_small",
            "logger": "wandb_offline",
            "overrides": {
                "trainer.max_steps": 2,
                "trainer.save_steps": 1,
                "task.heldout_size": 16,
                "trainer.per_device_train_batch_size": 8,
                "trainer.num_generations": 4,
                "trainer.gradient_accumulation_steps": 1,
            },
        },
        "grid": {"method": ["full", "stare"]},
        "seeds": [0],
        "eval": {"benchmarks": ["arithmetic"], "n": 4, "batch_size": 256},
        "launcher": {"name": "local", "workers": 2},
        "output": str(tmp_path / "runs"),
    }
    path = tmp_path / "demo_ci.yaml"
    path.write_text(yaml.safe_dump(sweep))
    out = tmp_path / "analysis"
    assert main(["demo", "--sweep", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| full |" in printed and "| stare |" in printed

    cells = pd.read_csv(out / "results.csv")
    assert set(cells["rule"]) == {"full", "stare"}
    assert set(cells["n_seeds"]) == {1}
    assert ((cells["mean_pct"] >= 0) & (cells["mean_pct"] <= 100)).all()
    md = (out / "results.md").read_text()
    assert "avg@4" in md and "T=1.0, top-p=0.7, n=4" in md
    tex = (out / "results.tex").read_text()
    assert "\\toprule" in tex and tex.count("{") == tex.count("}")
    pngs = sorted((out / "figures").glob("*.png"))
    names = {p.name for p in pngs}
    assert {"train_reward.png", "passk_arithmetic.png"} <= names
    for p in pngs:
        head = p.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", head[16:24]) == (640, 400)
    # W&B offline files were written inside each run dir
    assert list((tmp_path / "runs" / "demo_ci").glob("*/wandb/offline-run-*/run-*.wandb"))
