"""A 2-step sweep on Reasoning Gym: a tiny byte-level Qwen2 built here (chat template, so the prompts go
through it) trains on a mix of two datasets with two rules and is evaluated on both; `table` shows both
columns with the claims' intervals, `plot` draws both, W&B's items name them, and the run records its
splits (task.json) and each sample's score."""

from __future__ import annotations

import json

import pandas as pd
import yaml
from tiny_qwen2 import tiny_qwen2

from stare_lab.cli import main
from stare_lab.tasks.reasoning_gym import ReasoningGymTask
from stare_lab.viewer.wandb_export import eval_items

MIX = [
    {"name": "knights_knaves", "weight": 1.0, "config": {"n_people": 2}},
    {"name": "chain_sum", "weight": 1.0, "config": {}},
]


def test_a_two_step_sweep_trains_and_evaluates_on_two_datasets(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    texts = [r["prompt"] for r in ReasoningGymTask(MIX, train_size=64, heldout_size=4, chat=False).train_rows()]
    model = tiny_qwen2(tmp_path / "qwen2-tiny", texts)
    sweep = {
        "name": "gym",
        "base": {
            "model": "builtin",
            "task": "reasoning_gym",
            "logger": "none",
            "overrides": {
                "model.name_or_path": str(model),
                "task.datasets": MIX,
                "task.train_size": 16,
                "task.heldout_size": 3,
                "trainer.max_steps": 2,
                "trainer.per_device_train_batch_size": 4,
                "trainer.num_generations": 4,
                "trainer.gradient_accumulation_steps": 1,
                "trainer.max_completion_length": 8,
            },
        },
        "grid": {"method": ["full", "top_entropy"]},
        "seeds": 1,
        # each dataset's benchmark, and the task's own name: both held-out sets together
        "eval": {"benchmarks": ["rg:knights_knaves", "rg:chain_sum", "reasoning_gym"], "n": 2, "max_tokens": 8},
        "launcher": {"name": "local", "workers": 1},
    }
    path = tmp_path / "gym.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    assert main(["sweep", "run", str(path)]) == 0
    capsys.readouterr()
    runs = sorted(p.parent for p in (tmp_path / "runs" / "gym").glob("*/config.yaml"))
    assert len(runs) == 2
    for run in runs:
        check_run(run)
    assert main(["table", str(path)]) == 0
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if line.startswith("| rule"))
    assert "| reasoning_gym (6) | rg:chain_sum (3) | rg:knights_knaves (3) |" in header, table
    assert "| full |" in table and "| top_entropy |" in table and "verifier=reasoning_gym" in table
    # the claims: each difference to full with its interval over seeds and problems
    assert "rg:chain_sum 3, rg:knights_knaves 3. Differences to full in points" in table
    assert main(["table", str(path), "--metric", "score@2", "--baseline", "none"]) == 0
    assert "score@2" in capsys.readouterr().out
    assert main(["plot", str(path), "--out", str(tmp_path / "plots")]) == 0
    drawn = {p.name for p in (tmp_path / "plots").iterdir()}
    assert {"passk_rg_knights_knaves.png", "passk_rg_chain_sum.png"} <= drawn, drawn


def check_run(run):
    """The run's splits, its logged task metrics and its two evaluations with their scores."""
    record = json.loads((run / "task.json").read_text())
    assert record["train"]["problems"] == 16 and sum(record["train"]["per_dataset"].values()) == 16
    assert set(record["heldout"]) == {"knights_knaves", "chain_sum"}
    assert record["categories"] == {"knights_knaves": "logic", "chain_sum": "arithmetic"}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("task/no_answer" in r for r in rows)
    ids = {}
    for bench in ("rg:knights_knaves", "rg:chain_sum"):
        (result,) = [json.loads(p.read_text()) for p in (run / "eval" / bench).glob("*.json")]
        samples = pd.read_parquet(run / "eval" / bench / f"{result['settings_key']}.parquet")
        assert result["verifier"] == "reasoning_gym" and result["num_problems"] == 3 and len(samples) == 6
        assert samples["problem_id"].str.startswith(bench[3:] + "/heldout/").all()
        assert result["metrics"]["score@2"] == samples.groupby("problem_id")["score"].mean().mean()
        assert result["metrics"]["no_answer"] == samples["extracted"].isna().mean()
        assert (samples["correct"] == (samples["score"] == 1.0)).all()
        assert eval_items(result)[f"eval/{bench}/score@2"] == result["metrics"]["score@2"]  # W&B's summary
        ids[bench] = set(samples["problem_id"])
    (mixed,) = (run / "eval" / "reasoning_gym").glob("*.parquet")
    assert set(pd.read_parquet(mixed)["problem_id"]) == ids["rg:knights_knaves"] | ids["rg:chain_sum"]


def test_the_packaged_gym_sweep_expands_in_a_dry_run(tmp_path, monkeypatch, capsys):
    """sweeps/gym.yaml: a real model by name, a logic and algorithmic mix, the field's main rules; the
    dry run composes every run (task.datasets checked by the library) and writes nothing."""
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "run", "gym", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sweep gym: 27 runs" in out and not (tmp_path / "runs").exists()  # 7 arms and 2 controls × 3 seeds
    for arm in ("grpo", "grpo_microbatch", "stare", "top_entropy", "clip_cov", "kl_cov", "entropy_adv"):
        assert f"{arm} seed=2" in out
    from stare_lab.config.run_config import sweep_path
    from stare_lab.plan.expand import expand_sweep
    from stare_lab.plan.schema import load_sweep

    run = expand_sweep(load_sweep(sweep_path("gym"), output=tmp_path))[0]
    task, benchmarks = run.config["task"], run.config["eval"]["benchmarks"]
    assert run.config["model"]["name_or_path"] == "Qwen/Qwen2.5-1.5B-Instruct" and task["name"] == "reasoning_gym"
    names = [d["name"] for d in task["datasets"]]
    assert {ReasoningGymTask.category_of(n) for n in names} == {"logic", "algorithmic"}
    assert benchmarks == [f"rg:{n}" for n in names] + ["math500"]
