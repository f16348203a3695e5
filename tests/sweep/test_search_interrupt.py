"""Ctrl-C in an Optuna search: its local trials stop as a grid sweep's runs do, and `sweep run` resumes.

Real processes: the driver is sweep_fixtures' `sweep` command line with the stand-in runner (no model),
its trials submitit local jobs. The first driver's stand-in steps take a second each, so that the Ctrl-C
always finds the first trial's run training, however loaded the machine; the resuming driver's take 10 ms.
"""

from __future__ import annotations

import os
import signal

import optuna
from optuna.trial import TrialState
from sweep_fixtures import metric_steps, run_dirs, sweep_cli, wait_until, write_sweep

from stare_lab.launchers.local import STOP_WAIT_S
from stare_lab.record import read_status

STEPS = 10
SEARCH = {
    "params": {"method.params.W": {"low": 1.0, "high": 1.5}, "method.params.P": {"low": 0.05, "high": 0.3}},
    "objective": {"metric": "eval/arithmetic/avg@2", "direction": "maximize"},
    "trials": 3,
    "parallelism": 1,
    "sampler": "random",
    "seed": 0,
}


def training_past_its_first_checkpoint(tmp_path, driver):
    """The first trial's run folder once it is running with checkpoint-1 written, else None."""
    if driver.poll() is not None:  # the driver ended before the state waited for: show why
        raise AssertionError(f"sweep run exited {driver.returncode}:\n{driver.stdout.read()}")
    dirs = run_dirs(tmp_path, "search")
    if len(dirs) != 1 or (read_status(dirs[0]) or {}).get("state") != "running":
        return None
    return dirs[0] if (dirs[0] / "checkpoints" / "checkpoint-1" / "trainer_state.json").is_file() else None


def test_ctrl_c_stops_the_trial_records_it_interrupted_and_sweep_run_resumes_it(tmp_path):
    path = write_sweep(
        tmp_path,
        "search",
        search=SEARCH,
        launcher={"name": "local", "workers": 1},
        base={
            "model": "builtin",
            "logger": "none",
            "method": "stare",
            "overrides": {"trainer.max_steps": STEPS, "trainer.save_steps": 1},
        },
    )
    storage = f"sqlite:///{tmp_path / 'runs' / 'search' / 'optuna.db'}"
    driver = sweep_cli("run", str(path), standin=1.0, start_new_session=True)
    try:
        run = wait_until(lambda: training_past_its_first_checkpoint(tmp_path, driver), 300, "trial 0 training")
        os.killpg(driver.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        out, _ = driver.communicate(timeout=STOP_WAIT_S + 30)  # the pipe closes: no worker holds it any more
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert out.strip().splitlines()[-1] == "interrupted: local runs stopped; `sweep run` again resumes them"
    status = read_status(run)
    assert status["state"] == "interrupted" and status["attempts"] == 1, status  # its worker said so, not killed
    assert len(metric_steps(run)) < STEPS  # stopped, not trained to its end while the driver waited
    trials = optuna.load_study(study_name="search", storage=storage).trials
    assert [(t.state, t.user_attrs["run_id"]) for t in trials] == [(TrialState.RUNNING, run.name)]  # left to resume

    again = sweep_cli("run", str(path), standin=0.01)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out
    assert "resuming 1 trial(s) left running by an earlier launch" in out, out
    trials = optuna.load_study(study_name="search", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3  # the stopped trial finished, none lost
    dirs = run_dirs(tmp_path, "search")
    assert sorted(t.user_attrs["run_id"] for t in trials) == [d.name for d in dirs]  # one run per trial
    for d in dirs:
        assert read_status(d)["state"] == "finished" and metric_steps(d) == list(range(1, STEPS + 1)), d
    attempts = {d.name: read_status(d)["attempts"] for d in dirs}
    assert attempts == {d.name: 2 if d == run else 1 for d in dirs}  # resumed once, the others trained once
