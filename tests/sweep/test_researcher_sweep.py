"""A researcher's own sweep, written the way docs/sweeps.md says, on a real (tiny) local model: a
Qwen2 with a byte-level BPE tokenizer and a chat template, saved with save_pretrained; the math
task on the packaged MATH-500 file; LoRA set by a mapping and by a dotted key; a 20-problem
held-out slice. It runs to a table; a changed grid leaves the old arm out of the default table
and plot, `--all-runs` brings it back, and `sweep status` says how to remove it."""

from __future__ import annotations

from pathlib import Path

import yaml
from tiny_qwen2 import tiny_qwen2

from stare_lab.cli import main
from stare_lab.config.run_config import BENCHMARK_DATA_DIR
from stare_lab.tasks.loaders import load_records

MATH500 = BENCHMARK_DATA_DIR / "math500.jsonl"


def write(path: Path, sweep: dict) -> Path:
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def test_a_researchers_sweep_on_a_local_qwen2_runs_to_a_table(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    model = tiny_qwen2(tmp_path / "qwen2-tiny", [r["problem"] for r in load_records(str(MATH500))])
    sweep = {
        "name": "mine",
        "base": {
            "model": "builtin",  # the model defaults; the path below replaces the weights
            "task": "math",
            "logger": "none",
            "overrides": {
                "model.name_or_path": str(model),
                "model.lora": {"r": 4},  # a mapping ...
                "model.lora.alpha": 8,  # ... and a dotted key inside it
                "task.train_source": str(MATH500),
                "task.train_limit": 64,
                "task.heldout_source": str(MATH500),
                "task.heldout_limit": 20,
                "task.chat": True,
                "trainer.max_steps": 1,
                "trainer.per_device_train_batch_size": 4,
                "trainer.num_generations": 4,
                "trainer.gradient_accumulation_steps": 1,
                "trainer.max_completion_length": 8,
            },
        },
        "grid": {"method": ["full", "top_entropy"]},
        "seeds": 1,
        "eval": {"benchmarks": ["math"], "n": 2, "max_tokens": 8},
        "launcher": {"name": "local", "workers": 2},
    }
    path = write(tmp_path / "mine.yaml", sweep)
    assert main(["sweep", "run", str(path)]) == 0
    out = capsys.readouterr()
    # the held-out slice is the first 20 of the training file: said in one line before launch
    assert "warning: 20 of 20 held-out problems of 'math'" in out.err
    assert main(["table", str(path)]) == 0
    table = capsys.readouterr().out
    assert "| full |" in table and "| top_entropy |" in table and "has no results" not in table

    write(path, {**sweep, "grid": {"method": ["full"]}})  # the grid changed: top_entropy is an old arm
    assert main(["table", str(path)]) == 0
    captured = capsys.readouterr()
    assert "| full |" in captured.out and "top_entropy" not in captured.out
    assert "1 run(s) under" in captured.err and "--all-runs" in captured.err
    assert main(["table", str(path), "--all-runs"]) == 0
    assert "| top_entropy |" in capsys.readouterr().out
    assert main(["sweep", "status", str(path)]) == 0
    status = capsys.readouterr().out
    assert "1 run(s) not in the current plan" in status and "rm -r " in status
