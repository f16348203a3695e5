"""W&B offline run files hold exactly what metrics.jsonl holds (values read back from the .wandb file),
with the run's id, group, name, tags and resolved config; a resumed run continues the same W&B run."""

from __future__ import annotations

import math

import pytest
from sweep_fixtures import FailAt
from wandb_files import history_by_step, wandb_records

from stare_lab.config.run_config import compose, save_config
from stare_lab.record import read_metrics
from stare_lab.run.runner import execute

SMALL = [
    "method=stare",
    "trainer.per_device_train_batch_size=8",
    "trainer.num_generations=4",
    "trainer.gradient_accumulation_steps=1",
    "trainer.max_steps=3",
    "trainer.save_steps=1",
    "logger=wandb_offline",
    "eval.enabled=false",
    "run.sweep=wandb_test",
    "run.label='stare seed=0'",
]


def _run(tmp_path, name, extra=()):
    cfg = compose([*SMALL, *extra])
    d = tmp_path / name
    save_config(cfg, d / "config.yaml")
    return cfg, d


def test_wandb_values_equal_metrics_jsonl(tmp_path):
    cfg, d = _run(tmp_path, "run")
    execute(d)
    folders = list((d / "wandb").glob("offline-run-*"))
    assert len(folders) == 1 and (folders[0] / f"run-{cfg.run.id}.wandb").is_file()
    records = wandb_records(folders[0])
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["run_id"] == cfg.run.id and run["run_group"] == "wandb_test"
    assert run["display_name"] == "stare seed=0" and run["tags"] == ["stare", "seed=0"]
    config = run["config"]["update"]
    assert config["method"]["name"] == "stare" and config["method"]["params"]["W"] == pytest.approx(1.1)
    history = history_by_step(records)
    rows = read_metrics(d / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and sorted(history) == [1, 2, 3]
    compared = 0
    for row in rows:
        logged = history[row["step"]]
        for key, value in row.items():
            if key in ("step", "time") or value is None:
                continue
            assert logged[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (row["step"], key)
            compared += 1
    assert compared > 60
    assert any(math.isfinite(history[s]["rule/gate"]) for s in history)


def test_resumed_run_continues_the_same_wandb_run(tmp_path):
    cfg, d = _run(tmp_path, "resumed")
    with pytest.raises(RuntimeError, match="simulated crash at step 2"):
        execute(d, callbacks=[FailAt(2)])
    execute(d)
    ids = {p.name for f in (d / "wandb").glob("offline-run-*") for p in f.glob("run-*.wandb")}
    assert ids == {f"run-{cfg.run.id}.wandb"}
    # metrics.jsonl: each step once; the last W&B value of each step equals it
    rows = read_metrics(d / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    last: dict[int, dict] = {}
    for f in sorted((d / "wandb").glob("offline-run-*")):
        last.update(history_by_step(wandb_records(f)))
    for row in rows:
        assert last[row["step"]]["reward"] == pytest.approx(row["reward"])
