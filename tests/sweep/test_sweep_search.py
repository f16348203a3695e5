"""Optuna search: trials are runs; a killed study resumes from its storage; status reports the best."""

from __future__ import annotations

import os
import signal

import optuna
from optuna.trial import TrialState
from sweep_fixtures import metric_steps, run_dirs, sweep_cli, sweep_env, wait_until, write_sweep

from stare_lab.cli.sweep import main
from stare_lab.plan.schema import load_sweep
from stare_lab.record import read_status
from stare_lab.sweep.search import distributions, intermediate_values, objective_value

SEARCH = {
    "params": {"method.params.W": {"low": 1.0, "high": 1.5}, "method.params.P": {"low": 0.05, "high": 0.3}},
    "objective": {"metric": "eval/arithmetic/avg@2", "direction": "maximize"},
    "trials": 3,
    "parallelism": 1,
    "sampler": "random",
    "seed": 0,
}


def test_search_resumes_after_a_kill_and_reports_the_best_trial(tmp_path, in_process_env, capsys):
    path = write_sweep(
        tmp_path,
        "search",
        search=SEARCH,
        launcher={"name": "local", "workers": 1},
        base={
            "model": "builtin",
            "logger": "none",
            "method": "stare",
            "overrides": load_sweep(write_sweep(tmp_path, "tmp")).overrides,
        },
    )
    storage = f"sqlite:///{tmp_path / 'runs' / 'search' / 'optuna.db'}"
    proc = sweep_cli("run", str(path), env=sweep_env(), start_new_session=True)

    def one_complete_one_running():
        if proc.poll() is not None:  # the driver ended before the state we wait for: show why
            raise AssertionError(f"sweep run exited {proc.returncode}:\n{proc.stdout.read()}")
        # the driver creates the study before its first run folder: open the storage only after that, so
        # this poll never races the driver's creation of a fresh sqlite file (schema and study)
        dirs = run_dirs(tmp_path, "search")
        running = [d for d in dirs if (read_status(d) or {}).get("state") == "running"]
        if len(dirs) < 2 or not running:
            return None
        trials = optuna.load_study(study_name="search", storage=storage).get_trials(deepcopy=False)
        return any(t.state == TrialState.COMPLETE for t in trials) and running

    try:
        wait_until(one_complete_one_running, 300, "one trial complete and the next one running", every=0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    assert main(["sweep", "run", str(path)]) == 0
    assert "resuming 1 trial(s)" in capsys.readouterr().out
    study = optuna.load_study(study_name="search", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3  # the stale trial was finished, not lost
    dirs = run_dirs(tmp_path, "search")
    assert len(dirs) == 3
    for d in dirs:
        s = read_status(d)
        assert s["state"] == "finished" and metric_steps(d) == [1, 2]
    assert sorted(read_status(d)["attempts"] for d in dirs) == [1, 1, 2]
    values = {t.user_attrs["run_id"]: t.value for t in study.trials}
    assert values == {d.name: objective_value(d, "eval/arithmetic/avg@2") for d in dirs}

    assert main(["sweep", "run", str(path)]) == 0  # nothing left to do
    assert len(optuna.load_study(study_name="search", storage=storage).trials) == 3
    capsys.readouterr()
    assert main(["sweep", "status", str(path)]) == 0
    best = study.best_trial
    assert f"best trial: #{best.number} value={best.value:.6g}" in capsys.readouterr().out


def test_search_space_and_intermediate_values(tmp_path):
    spec = load_sweep(
        write_sweep(
            tmp_path,
            "s",
            search={
                **SEARCH,
                "params": {
                    "method.params.W": {"low": 1.0, "high": 1.5},
                    "trainer.max_steps": {"low": 2, "high": 8},
                    "method.params.P": {"low": 0.01, "high": 0.3, "log": True},
                    "method.params.variant": {"choices": ["O1", "C2"]},
                },
            },
            base={"model": "builtin", "method": "stare"},
        )
    )
    d = distributions(spec.search)
    assert type(d["trainer.max_steps"]).__name__ == "IntDistribution" and d["method.params.P"].log
    assert d["method.params.variant"].choices == ("O1", "C2")
    run = tmp_path / "run"
    (run / "eval" / "step-5").mkdir(parents=True)
    (run / "eval" / "step-5" / "arithmetic.json").write_text('{"metrics": {"avg@2": 0.25}}')
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.75}\n{"torn')
    assert intermediate_values(run, "eval/arithmetic/avg@2") == {5: 0.25}
    assert intermediate_values(run, "train/reward") == {1: 0.5, 2: 0.75}
    assert objective_value(run, "train/reward") == 0.75 and objective_value(run, "eval/arithmetic/avg@2") is None
