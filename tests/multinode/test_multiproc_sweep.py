"""A local sweep whose runs span 2 processes (gloo on CPU, the real runner and built-in model).

One test, three launches (about 80 s on 2 busy cores, hence `slow`): two runs of 2 processes
each, where rank 1 of the seed-0 run is SIGKILLed at step 2. Checked:
- the killed run fails within KILL_BOUND_S of the kill, its error one line naming rank 1;
- the other run goes on and finishes: one metrics.jsonl with steps 1..3 once, one W&B run, final
  evaluation written by rank 0 alone; status.json records world_size 2;
- `sweep run --retry-failed` resumes the failed run from checkpoint-1 on both ranks: every step
  logged exactly once, the same W&B run continued (run id = W&B id), no second claim refused.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml
from multiproc_fixtures import KILLED_MARK, TWO_PROCESS, kill_rank_1_of_seed_0
from sweep_fixtures import metric_steps, read_json, run_dirs, use_runner, write_sweep

from stare_lab.cli.sweep import main

pytestmark = pytest.mark.slow

# The stated bound for a rank that dies (docs/distributed.md §7): rank 0 sees the closed gloo
# connection at its next collective (within a step); the run is recorded failed after at most
# PEER_WAIT_S more. A rank that hangs alive is bounded by trainer.ddp_timeout_s instead.
KILL_BOUND_S = 30.0


def _wandb_ids(run_dir):
    return sorted({p.name.rsplit("-", 1)[-1] for p in (run_dir / "wandb").glob("offline-run-*")})


def test_two_process_runs_one_record_a_killed_rank_fails_its_run_and_resumes(
    tmp_path, in_process_env, monkeypatch, capsys
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    path = write_sweep(
        tmp_path, "mp", overrides=TWO_PROCESS, seeds=[0, 1], launcher={"name": "local", "workers": 1, "processes": 2}
    )
    data = yaml.safe_load(path.read_text())
    data["base"]["logger"] = "wandb_offline"
    path.write_text(yaml.safe_dump(data, sort_keys=False))

    use_runner(kill_rank_1_of_seed_0, monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 1
    runs = {read_json(d / "status.json")["seed"]: d for d in run_dirs(tmp_path, "mp")}
    killed, other = runs[0], runs[1]

    s = read_json(killed / "status.json")
    kill = read_json(killed / KILLED_MARK)
    assert s["state"] == "failed" and s["world_size"] == 2
    assert s["error"].startswith(f"rank 1 (pid {kill['pid']}) died") and "\n" not in s["error"], s["error"]
    recorded = time.mktime(time.strptime(s["finished"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert recorded - kill["time"] < KILL_BOUND_S, (recorded - kill["time"], s)
    assert metric_steps(killed) == [1]

    s = read_json(other / "status.json")
    assert s["state"] == "finished" and s["world_size"] == 2 and s["attempts"] == 1
    assert metric_steps(other) == [1, 2, 3]
    assert _wandb_ids(other) == [other.name]  # one W&B run, rank 0's
    assert len(list((other / "wandb").glob("offline-run-*"))) == 1
    assert len(list((other / "eval" / "arithmetic").glob("step-3_*.parquet"))) == 1

    capsys.readouterr()
    assert main(["sweep", "run", str(path), "--retry-failed"]) == 0
    assert "1 retry" in capsys.readouterr().out
    s = read_json(killed / "status.json")
    assert s["state"] == "finished" and s["attempts"] == 2 and s["world_size"] == 2
    assert metric_steps(killed) == [1, 2, 3]  # every step once
    rows = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["time"] < kill["time"] < rows[1]["time"]  # resumed from checkpoint-1
    assert _wandb_ids(killed) == [killed.name]  # the same W&B run continued
    assert read_json(other / "status.json")["attempts"] == 1  # the finished run was not redone
    logs = "".join(p.read_text() for p in (tmp_path / "runs" / "mp" / "submitit").rglob("*_log.out"))
    for rank in (0, 1):  # both ranks resumed from the checkpoint
        assert f"{killed.name}: rank {rank} resumes from checkpoint-1" in logs
