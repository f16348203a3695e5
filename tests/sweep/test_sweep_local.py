"""Local launcher: safe re-runs after SIGKILL, the sweep lock, failures and retries, the worker.

These run the real runner on the built-in model with tiny settings. STARE_LAB_SWEEP_TESTS_STANDIN=1
swaps in the stand-in runner of sweep_fixtures (same resume contract, no model) for development;
it reaches the workers through sweep_fixtures.use_runner.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_fixtures import (
    EXECUTE,
    STANDIN,
    STANDIN_STEP_S,
    crash_method_random,
    metric_steps,
    read_json,
    read_json_lines,
    run_dirs,
    standin_execute,
    standin_run_dir,
    sweep_cli,
    sweep_env,
    use_runner,
    wait_until,
    write_sweep,
)

from stare_lab.cli.sweep import main
from stare_lab.plan.lock import SweepLock
from stare_lab.plan.schema import SweepError
from stare_lab.record import read_status
from stare_lab.sweep import worker
from stare_lab.sweep.worker import run_one


def by_label(tmp_path: Path, name: str) -> dict[str, Path]:
    return {read_json(d / "status.json")["label"]: d for d in run_dirs(tmp_path, name)}


def test_sigkilled_sweep_rerun_finishes_every_run_exactly_once(tmp_path, in_process_env, capsys, monkeypatch):
    path = write_sweep(
        tmp_path,
        "killed",
        overrides={"trainer.max_steps": 4},
        grid={"method": ["full", "top_entropy", "random"]},
        launcher={"name": "local", "workers": 1},
    )
    proc = sweep_cli("run", str(path), env=sweep_env(), standin=STANDIN_STEP_S, start_new_session=True)

    def first_done_second_checkpointed():
        runs = {read_json(d / "status.json")["label"]: d for d in run_dirs(tmp_path, "killed")}
        states = {k: (read_status(d) or {}).get("state") for k, d in runs.items()}
        done = [k for k, s in states.items() if s == "finished"]
        busy = [
            runs[k]
            for k, s in states.items()
            if s == "running" and (runs[k] / "checkpoints" / "checkpoint-1" / "trainer_state.json").is_file()
        ]
        return (done, busy[0]) if done and busy and (busy[0] / "metrics.jsonl").is_file() else None

    try:
        done, busy = wait_until(
            first_done_second_checkpointed, 240, "one run finished and one past its first checkpoint", every=0.05
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher, its worker, everything
        proc.wait()
    killed_at = time.time()
    runs = by_label(tmp_path, "killed")
    finished_metrics = {k: (runs[k] / "metrics.jsonl").read_bytes() for k in done}
    assert read_status(busy)["state"] == "running"  # the record of a worker that died

    if EXECUTE:
        use_runner(EXECUTE, monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{len(done)} finished (skipped)" in out
    for label, d in by_label(tmp_path, "killed").items():
        status = read_json(d / "status.json")
        assert status["state"] == "finished" and (d / "config.yaml").is_file()
        assert metric_steps(d) == [1, 2, 3, 4], label  # every step once: nothing duplicated
        assert status["host"] and status["started"] and status["finished"] and status["duration_s"] > 0
        if label in done:  # not retrained
            assert status["attempts"] == 1 and (d / "metrics.jsonl").read_bytes() == finished_metrics[label]
        elif d == busy:  # resumed from its checkpoint, not restarted
            assert status["attempts"] == 2
            first = read_json_lines(d / "metrics.jsonl")[0]
            assert first["time"] < killed_at
        else:
            assert status["attempts"] == 1


def test_a_failed_run_is_recorded_and_retried_only_on_request(tmp_path, in_process_env, capsys, monkeypatch):
    # the `random` run's real runner crashes at its first step (a run failing on its own)
    execute = (
        functools.partial(standin_execute, step_s=0.3, fail_at=1, only="random") if STANDIN else crash_method_random
    )
    path = write_sweep(
        tmp_path, "failing", grid={"method": ["full", "random"]}, launcher={"name": "local", "workers": 2}
    )
    use_runner(execute, monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 1
    runs = by_label(tmp_path, "failing")
    good, bad = runs["full seed=0"], runs["random seed=0"]
    assert read_status(good)["state"] == "finished"
    failed = read_status(bad)
    assert failed["state"] == "failed" and failed["error"] == "RuntimeError: simulated crash at step 1"
    assert "Traceback" in failed["traceback"] and failed["attempts"] == 1

    capsys.readouterr()
    assert main(["sweep", "status", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 failed" in out and "1 finished" in out and f"error: {failed['error']}" in out

    assert main(["sweep", "run", str(path)]) == 1  # without --retry-failed: left alone
    assert "1 failed (skipped; --retry-failed" in capsys.readouterr().out
    assert read_status(bad)["attempts"] == 1 and read_status(good)["attempts"] == 1
    assert main(["sweep", "run", str(path), "--retry-failed"]) == 1
    assert read_status(bad)["attempts"] == 2 and read_status(good)["attempts"] == 1


def test_one_sweep_run_at_a_time_and_a_dead_holder_frees_the_lock(tmp_path, capsys):
    path = write_sweep(tmp_path, "locked")
    folder = tmp_path / "runs" / "locked"
    with SweepLock(folder, "locked"):
        assert main(["sweep", "run", str(path)]) == 2
        err = capsys.readouterr().err
        assert "already running" in err and f"pid {os.getpid()}" in err
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from stare_lab.plan.lock import SweepLock; "
            f"SweepLock(Path({str(folder)!r}), 'locked').acquire(); print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=sweep_env(),
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(SweepError, match="already running"):
        SweepLock(folder, "locked").acquire()
    holder.kill()
    holder.wait()
    SweepLock(folder, "locked").acquire().release()  # a crashed holder leaves no lock behind


def test_run_one_records_each_outcome(tmp_path, monkeypatch):
    def runner(execute):  # the worker's one call of the runner
        monkeypatch.setattr(worker, "execute_run", execute)

    run_dir = standin_run_dir(tmp_path)
    runner(standin_execute)
    status = run_one(run_dir)
    assert status["state"] == "finished" and status["attempts"] == 1 and status["error"] is None
    runner(lambda d: pytest.fail("a finished run ran again"))
    assert run_one(run_dir)["attempts"] == 1

    def crash(d):
        raise RuntimeError("boom\nsecond line")

    with pytest.raises(RuntimeError):
        runner(crash)
        run_one(run_dir, force=True)
    s = read_status(run_dir)
    assert s["state"] == "failed" and s["error"] == "RuntimeError: boom" and "crash" in s["traceback"]
    assert s["attempts"] == 2 and s["finished"]

    def interrupted(d):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner(interrupted)
        run_one(run_dir)
    s = read_status(run_dir)
    assert s["state"] == "interrupted" and s["attempts"] == 3 and s["pid"] == os.getpid()
