"""Never twice, never silently: killed drivers, Ctrl-C, a full disk, damaged records, a diverging run.

Real processes throughout: the sweep driver is `python -m stare_lab.cli sweep` in a subprocess, workers
are submitit local jobs, runs use the real runner on the built-in model unless a test only needs
the launcher (then the stand-in runner of sweep_fixtures, through sweep_fixtures.use_runner).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_fixtures import (
    FailAt,
    as_terminal_foreground,
    metric_steps,
    run_dirs,
    sweep_cli,
    sweep_env,
    wait_until,
    write_sweep,
)

from stare_lab.cli.sweep import main as sweep_main
from stare_lab.config.run_config import compose, save_config
from stare_lab.launchers.jobs import KILL_WAIT_S
from stare_lab.launchers.local import STOP_WAIT_S
from stare_lab.record import new_status, read_metrics, read_status, write_status
from stare_lab.run.runner import execute

SMALL = [
    "trainer.per_device_train_batch_size=8",
    "trainer.num_generations=4",
    "trainer.gradient_accumulation_steps=1",
    "trainer.save_steps=1",
    "trainer.save_total_limit=5",
    "logger=none",
    "eval.enabled=false",
]


def wandb_ids(run_dir: Path) -> list[str]:
    """One entry per W&B run file written (a resumed attempt adds one with the same id)."""
    return sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def _statuses(tmp_path: Path, name: str) -> list[dict]:
    return [read_status(d) or {} for d in run_dirs(tmp_path, name)]


def test_driver_sigkilled_six_times_trains_each_run_once(tmp_path):
    """SIGKILL only the driver (its workers live on) at six moments, re-running after each."""
    path = write_sweep(
        tmp_path,
        "kills",
        overrides={"trainer.max_steps": 3},
        grid={"method": ["full", "random"]},
        launcher={"name": "local", "workers": 1},
        eval=False,
    )
    raw = path.read_text().replace("logger: none", "logger: wandb_offline")
    path.write_text(raw)
    env = sweep_env(WANDB_MODE="offline")
    moments = [
        lambda: True,  # at once
        lambda: any(s.get("state") == "pending" for s in _statuses(tmp_path, "kills")),  # queued
        lambda: any(s.get("pid") for s in _statuses(tmp_path, "kills")),  # submitted
        lambda: any(s.get("state") == "running" for s in _statuses(tmp_path, "kills")),
        lambda: any((d / "checkpoints" / "checkpoint-1").is_dir() for d in run_dirs(tmp_path, "kills")),
        lambda: any(s.get("state") == "finished" for s in _statuses(tmp_path, "kills")),
    ]
    for moment in moments:
        driver = sweep_cli("run", str(path), env=env)
        wait_until(lambda: moment() or driver.poll() is not None, 120, "the moment to kill the driver", every=0.05)
        driver.send_signal(signal.SIGKILL)  # the driver alone: its local jobs are orphaned, alive
        driver.wait()
    final = sweep_cli("run", str(path), env=env)
    out, _ = final.communicate(timeout=300)
    assert final.returncode == 0, out
    dirs = run_dirs(tmp_path, "kills")
    assert len(dirs) == 2
    for d in dirs:
        status = read_status(d)
        assert status["state"] == "finished" and status["attempts"] == 1, (d.name, status)  # trained once
        assert metric_steps(d) == [1, 2, 3]  # no step twice
        assert wandb_ids(d) == [f"run-{d.name}.wandb"]  # one W&B run


def test_ctrl_c_ends_in_one_line_and_records_runs_interrupted(tmp_path):
    # runs far longer than any wait below (40,000 stand-in steps): the interrupt always finds them running,
    # however loaded the machine
    path = write_sweep(
        tmp_path,
        "ctrlc",
        overrides={"trainer.max_steps": 40_000},
        grid={"method": ["full", "random"]},
        launcher={"name": "local", "workers": 2},
    )
    driver = sweep_cli("run", str(path), standin=0.2, start_new_session=True)
    wait_until(lambda: sum(s.get("state") == "running" for s in _statuses(tmp_path, "ctrlc")) == 2, 120, "both running")
    os.killpg(driver.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, _ = driver.communicate(timeout=60)
    assert driver.returncode == 130
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert out.strip().splitlines()[-1] == "interrupted: local runs stopped; `sweep run` again resumes them"
    assert [s["state"] for s in _statuses(tmp_path, "ctrlc")] == ["interrupted", "interrupted"]


def test_the_drivers_tests_start_take_ctrl_c_even_where_the_suite_ignores_it():
    """A suite run in the background of a non-interactive shell has SIGINT ignored, and so, without
    `as_terminal_foreground`, has every driver it starts: the Ctrl-C tests waited out their timeouts."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    probe = [sys.executable, "-c", code]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # this process as such a shell starts it
    try:
        inherited = subprocess.run(probe, capture_output=True, text=True, timeout=60).stdout.strip()
        foreground = subprocess.run(
            probe, capture_output=True, text=True, timeout=60, preexec_fn=as_terminal_foreground
        ).stdout.strip()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (inherited, foreground) == ("False", "True")


def test_ctrl_c_ends_promptly_when_workers_do_not_end_on_sigterm(tmp_path):
    """A worker that does not end on SIGTERM (inside a long call, on a busy node) is killed after the
    driver's bounded wait, and its run recorded interrupted: the driver, and every process holding its
    output, end within STOP_WAIT_S + KILL_WAIT_S of the Ctrl-C, not when the worker's run would end."""
    path = write_sweep(
        tmp_path,
        "deaf",
        overrides={"trainer.max_steps": 40_000},
        grid={"method": ["full", "random"]},
        launcher={"name": "local", "workers": 2},
    )
    driver = sweep_cli("run", str(path), standin=0.2, deaf=True, start_new_session=True)
    try:
        # past the first step: the stand-in has set SIGTERM aside by then
        wait_until(lambda: sum(_stepping(d) for d in run_dirs(tmp_path, "deaf")) == 2, 120, "both stepping")
        os.killpg(driver.pid, signal.SIGINT)
        t0 = time.monotonic()
        out, _ = driver.communicate(timeout=STOP_WAIT_S + KILL_WAIT_S + 30)  # pipe closed: no process holds it
        waited = time.monotonic() - t0
    finally:  # a driver that failed to kill them leaves deaf workers of 40,000 steps: the group goes
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    assert waited >= STOP_WAIT_S  # the workers had their chance to record the end themselves
    assert driver.returncode == 130
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert out.strip().splitlines()[-1] == (
        f"interrupted: local runs stopped (2 killed: still running {STOP_WAIT_S:g} s after SIGTERM); "
        "`sweep run` again resumes them"
    )
    statuses = _statuses(tmp_path, "deaf")
    assert [s["state"] for s in statuses] == ["interrupted", "interrupted"]
    assert all("killed" in s["error"] for s in statuses), statuses


def test_a_worker_stopped_while_it_starts_leaves_at_once_and_takes_no_run(tmp_path):
    """SIGTERM while a queue worker still imports (torch, transformers, TRL: seconds, more on a busy
    node) ends it at once: submitit's own handler, set before the worker's code runs, ignores SIGTERM,
    and the worker would take a pending run after the driver had said its runs were stopped."""
    run_dir = tmp_path / "r"
    write_status(run_dir, new_status())
    started = tmp_path / "importing"
    code = f"""
import signal, time
from pathlib import Path
from stare_lab.sweep import worker
signal.signal(signal.SIGTERM, lambda *_: None)  # submitit's "bypass", as in a submitted job


def slow_imports():  # the runner's modules, imported by a long-lived worker before its first run
    Path({str(started)!r}).touch()
    time.sleep(120)
    return {{}}


worker.loaded_code = slow_imports
worker.QueueWorker(1)([{str(run_dir)!r}])
"""
    proc = subprocess.Popen([sys.executable, "-c", code], env=sweep_env(), stderr=subprocess.PIPE, text=True)
    try:
        wait_until(started.exists, 120, "the worker importing")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert read_status(run_dir)["state"] == "pending"  # not taken: the next `sweep run` starts it


def _stepping(run_dir: Path) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return (read_status(run_dir) or {}).get("state") == "running" and metrics.is_file() and metrics.stat().st_size > 0


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs: room for a run's records, not for its first checkpoint (the model alone is 4 MB)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if (
        shutil.which("mount") is None
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("can not mount a small tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_fails_the_run_with_the_reason(tmp_path, small_disk, in_process_env, capsys):
    path = write_sweep(
        tmp_path,
        "full",
        overrides={"trainer.max_steps": 2},
        launcher={"name": "local", "workers": 1},
        output=str(small_disk / "runs"),
        eval=False,
    )
    assert sweep_main(["sweep", "run", str(path)]) == 1
    (run_dir,) = [d for d in (small_disk / "runs" / "full").iterdir() if (d / "status.json").is_file()]
    status = read_status(run_dir)
    assert status["state"] == "failed" and "No space left on device" in status["error"], status
    capsys.readouterr()
    assert sweep_main(["sweep", "status", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 failed" in out and "error: " in out and "No space left on device" in out


def test_a_corrupt_status_is_reported_kept_and_never_restarted_as_new(tmp_path, in_process_env, capsys, monkeypatch):
    from sweep_fixtures import standin_execute, use_runner

    use_runner(standin_execute, monkeypatch.setattr)

    path = write_sweep(tmp_path, "garbled", launcher={"name": "local", "workers": 1})
    assert sweep_main(["sweep", "run", str(path)]) == 0
    (run_dir,) = run_dirs(tmp_path, "garbled")
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    (run_dir / "status.json").write_text("\x00\x00garbage")
    capsys.readouterr()
    assert sweep_main(["sweep", "status", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 corrupt" in out and "status.json: not JSON" in out
    assert sweep_main(["sweep", "run", str(path)]) == 1  # left alone, said so
    assert "1 with an unreadable status.json (skipped" in capsys.readouterr().out
    assert (run_dir / "status.json").read_text() == "\x00\x00garbage" and (
        run_dir / "metrics.jsonl"
    ).read_bytes() == metrics
    assert sweep_main(["sweep", "run", str(path), "--retry-failed"]) == 0
    (kept,) = run_dir.glob("status.json.bad-*")
    assert kept.read_text() == "\x00\x00garbage" and read_status(run_dir)["state"] == "finished"
    assert metric_steps(run_dir) == [1, 2]  # resumed from its checkpoint


def _run_dir(tmp_path: Path, name: str, *overrides: str) -> Path:
    d = tmp_path / name
    save_config(compose(["method=stare", *SMALL, *overrides]), d / "config.yaml")
    return d


def test_a_truncated_newest_checkpoint_is_named_and_resume_uses_the_previous_one(tmp_path, capsys):
    d = _run_dir(tmp_path, "trunc", "trainer.max_steps=3")
    with pytest.raises(RuntimeError, match="simulated crash at step 3"):
        execute(d, callbacks=[FailAt(3)])
    weights = d / "checkpoints" / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a save cut short
    rows_before = read_metrics(d)
    capsys.readouterr()
    execute(d)
    out = capsys.readouterr().out
    assert (
        "trunc: checkpoint-2 is unreadable (model.safetensors: truncated" in out and "resuming from checkpoint-1" in out
    )
    assert (d / "checkpoints" / "corrupt-checkpoint-2" / "model.safetensors").is_file()  # kept, out of the way
    rows = read_metrics(d)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0] == rows_before[0]
    assert rows[1]["time"] > rows_before[1]["time"]  # step 2 trained again


def test_a_torn_metrics_row_is_restored_from_the_checkpoint(tmp_path, capsys):
    d = _run_dir(tmp_path, "torn", "trainer.max_steps=3")
    with pytest.raises(RuntimeError, match="simulated crash at step 3"):
        execute(d, callbacks=[FailAt(3)])
    rows = read_metrics(d)
    assert [r["step"] for r in rows] == [1, 2]  # the crash came before step 3 was logged
    text = (d / "metrics.jsonl").read_text().splitlines()
    (d / "metrics.jsonl").write_text(text[0] + "\n" + text[1][:20])  # step 2's row torn; checkpoint-2 exists
    execute(d)
    assert "torn: restored metrics of step(s) 2 from checkpoint-2" in capsys.readouterr().out
    again = read_metrics(d)
    assert [r["step"] for r in again] == [1, 2, 3]
    assert again[1]["reward"] == pytest.approx(rows[1]["reward"]) and again[1]["loss"] == pytest.approx(rows[1]["loss"])


def test_a_diverging_run_stops_at_the_step_with_one_line(tmp_path, in_process_env, capsys):
    """A learning rate of 1e39 overflows float32 weights at the first optimizer step."""
    path = write_sweep(
        tmp_path,
        "nan",
        overrides={"trainer.max_steps": 3, "trainer.learning_rate": 1e39},
        launcher={"name": "local", "workers": 1},
        eval=False,
    )
    assert sweep_main(["sweep", "run", str(path)]) == 1
    (run_dir,) = run_dirs(tmp_path, "nan")
    status = read_status(run_dir)
    assert status["state"] == "failed"
    assert status["error"].startswith("NonFiniteError: step 1: the model weights became non-finite ("), status["error"]
    assert not (run_dir / "metrics.jsonl").exists() or [r["step"] for r in read_metrics(run_dir)] == [1]
    assert "probability tensor" not in json.dumps(status)


@pytest.mark.parametrize(
    ("state", "job", "restarts", "runs"),
    [
        ("failed", "77_3", "1", False),  # Slurm's own requeue of the job that failed the run: left alone
        ("failed", "77_3", "0", True),  # the same job id on its first start (never the case after a failure)
        ("failed", "81_0", "0", True),  # `sweep run --retry-failed` submits a new job: it resumes
        ("failed", "81_0", "2", True),  # another job's requeue: not the one that failed it
        ("interrupted", "77_3", "1", True),  # pre-empted or timed out, requeued: resumes as before
    ],
)
def test_slurms_own_requeue_does_not_start_a_failed_run_again(tmp_path, monkeypatch, state, job, restarts, runs):
    """A node that dies fails the run (rank 0 records it); Slurm then requeues the job on its own,
    with no `sweep run` watching to cancel it. That start must not train the failed run again."""
    from sweep_fixtures import standin_execute, use_runner

    from stare_lab.record import new_status, write_status
    from stare_lab.sweep.worker import run_one

    use_runner(standin_execute, monkeypatch.setattr)
    run_dir = _run_dir(tmp_path, "r")
    failed = {**new_status("stare seed=0"), "state": state, "attempts": 1, "slurm_job_id": "77_3", "error": "x"}
    write_status(run_dir, failed)
    array, task = job.split("_")
    for key, value in (("SLURM_ARRAY_JOB_ID", array), ("SLURM_ARRAY_TASK_ID", task), ("SLURM_JOB_ID", "9" + array)):
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_RESTART_COUNT", restarts)
    result = run_one(run_dir)
    if runs:
        assert read_status(run_dir)["state"] == "finished" and read_status(run_dir)["attempts"] == 2
    else:
        assert result.get("skipped") is True and read_status(run_dir) == failed
        assert not (run_dir / "metrics.jsonl").exists()
