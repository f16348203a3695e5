"""Fixtures and helpers of the sweep tests (imported by tests/sweep/test_sweep_*.py and others).

- `slurm_cluster`: the local Slurm cluster started by scripts/slurm_cluster.sh. Without one the
  test skips with the reason, except under CI (CI=1 or STARE_LAB_REQUIRE_SLURM=1), where it fails.
- `write_sweep`: a sweep file in tmp_path with the tiny real-runner settings.
- `standin_execute`: a stand-in for stare_lab.run.runner.execute with the same resume contract
  (checkpoints every save_steps, metrics rows after the last checkpoint dropped on resume); only
  for launcher tests that do not need a model.
- `use_runner(runner, set_attr)`: workers run `runner` in place of the real one, in this process
  and in every job submitted from it (production code has no parameter for it: the worker calls
  the runner in one place, stare_lab.sweep.worker.execute_run, which this patches; a submitted
  job's callable is wrapped in `RunnerPatch`, which patches it in the job's process before it
  runs). `sweep_cli(..., standin=S)` runs this file as the driver, with the stand-in.
- `FailAt` / `crash_array_task_1`: the real runner crashing at a given step (a TrainerCallback).

Run as a script, this file is the `sweep` command line with an optional stand-in runner:
`python tests/support/sweep_fixtures.py [--standin SECONDS_PER_STEP] run FILE ...`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib
import yaml

from stare_lab.config.run_config import CONF_DIR

ROOT = Path(__file__).resolve().parents[2]
# The test folders pytest puts on sys.path (pyproject's [tool.pytest.ini_options] pythonpath, read here so
# that the processes tests start import the same helper modules by the same bare names).
TEST_PATH = [
    str(ROOT / folder)
    for folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["pythonpath"]
]
SLURM_CONF = Path(os.environ.get("STARE_LAB_SLURM_DIR", "/tmp/stare_lab_slurm")) / "slurm.conf"
# The tiny real-runner settings: a few seconds per run on the built-in model.
TINY = {
    "trainer.max_steps": 2,
    "trainer.save_steps": 1,
    "trainer.per_device_train_batch_size": 8,
    "trainer.num_generations": 4,
    "trainer.gradient_accumulation_steps": 1,
    "trainer.max_completion_length": 8,
    "task.train_size": 64,
    "task.heldout_size": 16,
}
# Small task splits where conf/task/arithmetic.yaml declares them (a sweep can only set declared keys).
_TASK_KEYS = yaml.safe_load((CONF_DIR / "task" / "arithmetic.yaml").read_text()) or {}
TINY = {k: v for k, v in TINY.items() if not k.startswith("task.") or k.split(".", 1)[1] in _TASK_KEYS}


def slurm_required() -> bool:
    return os.environ.get("CI") == "1" or os.environ.get("STARE_LAB_REQUIRE_SLURM") == "1"


def _slurm_problem(conf: Path) -> str | None:
    if not shutil.which("sbatch"):
        return "Slurm is not installed (run scripts/slurm_cluster.sh start)"
    if not conf.is_file():
        return f"no cluster config at {conf} (run scripts/slurm_cluster.sh start)"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        nodes = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=20)
        acct = subprocess.run(
            ["sacct", "-n", "-X", "-o", "JobID", "-S", "now-1minutes"],
            env=env,
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the Slurm cluster does not answer: {e}"
    if nodes.returncode != 0 or not any(s.strip("*~#") in ("idle", "mix", "alloc") for s in nodes.stdout.split()):
        return f"no usable Slurm node: {(nodes.stderr or nodes.stdout).strip()[:200]}"
    if acct.returncode != 0:
        return f"Slurm accounting (slurmdbd) does not answer: {acct.stderr.strip()[:200]}"
    return None


def cluster_conf() -> Path:
    """The cluster config the tests use: $SLURM_CONF, else scripts/slurm_cluster.sh's."""
    return Path(os.environ.get("SLURM_CONF") or SLURM_CONF)


def cluster_session(conf: Path, problem: str | None, needs: str = ""):
    """The body of a session fixture for a cluster (`yield from`): skip, or fail under CI, naming what the
    tests need and the `problem`; else `conf` as SLURM_CONF while the session runs."""
    if problem:
        said = f"{needs}: {problem}" if needs else problem
        if slurm_required():
            pytest.fail(f"Slurm cluster required (CI / STARE_LAB_REQUIRE_SLURM) but {said}")
        pytest.skip(said)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    yield conf
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


@pytest.fixture(scope="session")
def slurm_cluster():
    """SLURM_CONF of a running cluster with accounting; skip (or fail under CI) without one."""
    conf = cluster_conf()
    yield from cluster_session(conf, _slurm_problem(conf))


# a sweep's `launcher:` on the local cluster: one CPU and 1 GB a job, two jobs at once
SLURM_LAUNCHER = {
    "name": "slurm",
    "cpus_per_task": 1,
    "mem_gb": 1,
    "timeout_min": 15,
    "array_parallelism": 2,
    "gpus_per_node": 0,
}


def write_sweep(tmp_path: Path, name: str = "s", overrides: dict | None = None, **fields) -> Path:
    """A sweep file: built-in model, logger none, tiny trainer settings, eval n=2, output tmp_path/runs."""
    data = {
        "name": name,
        "base": {"model": "builtin", "logger": "none", "overrides": {**TINY, **(overrides or {})}},
        "seeds": [0],
        "eval": {"n": 2},
        "output": str(tmp_path / "runs"),
    }
    data.update(fields)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sweep_env(**extra: str) -> dict[str, str]:
    """Environment of a `python -m stare_lab.cli sweep` subprocess (the test folders importable for the stand-in)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *TEST_PATH, os.environ.get("PYTHONPATH", "")]),
        "WANDB_MODE": "disabled",
    }
    env.update(extra)
    return env


SWEEP = [sys.executable, "-m", "stare_lab.cli", "sweep"]  # `stare-lab sweep` in this interpreter


def as_terminal_foreground() -> None:
    """A child's SIGINT at its default, set between fork and exec (Popen's preexec_fn), as a terminal's
    shell starts a foreground job. A test process run in the background of a non-interactive shell (a CI
    script, `make test &`, an agent's runner) inherits SIGINT ignored, every child it starts inherits that,
    and Python keeps an inherited SIG_IGN: a driver started so would never see the Ctrl-C a test sends
    (the Ctrl-C tests then waited out their timeouts inside such suites while passing in a terminal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sweep_cli(
    *args: str, env: dict | None = None, standin: float | None = None, deaf: bool = False, **popen
) -> subprocess.Popen:
    """`stare-lab sweep ARGS` in a subprocess (the driver); `standin`: seconds per stand-in step;
    `deaf`: the stand-in ignores SIGTERM (`standin_deaf_to_sigterm`)."""
    cmd = [*SWEEP, *args]
    if standin is not None:
        runner = ["--standin-deaf" if deaf else "--standin", str(standin)]
        cmd = [sys.executable, str(Path(__file__)), *runner, *args]
    popen.setdefault("preexec_fn", as_terminal_foreground)  # a Ctrl-C reaches it however the suite was started
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env or sweep_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )


def sweep_run(path: Path, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`stare-lab sweep run PATH ARGS` to its end in a subprocess, its output captured."""
    cmd = [*SWEEP, "run", str(path), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env or sweep_env(), capture_output=True, text=True, timeout=timeout)


def standin_run_dir(tmp_path: Path) -> Path:
    """<tmp_path>/r with the smallest config a stand-in run reads (2 steps, a checkpoint each, avg@2)."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(
        "trainer: {max_steps: 2, save_steps: 1}\neval: {n: 2, benchmarks: [arithmetic]}\n"
        "method: {params: {}}\ntask: {name: arithmetic}\n"
    )
    return run_dir


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def metric_steps(run_dir: Path) -> list[int]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if line.strip()]


def wait_until(predicate, timeout: float, what: str, every: float = 0.3):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    import hang_report  # where every process of the test was when the wait gave up (in the CI log)

    print(hang_report.report_children(f"waiting for {what}"), file=sys.stderr, flush=True)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def run_dirs(tmp_path: Path, name: str) -> list[Path]:
    folder = tmp_path / "runs" / name
    return sorted(p for p in folder.iterdir() if (p / "status.json").is_file()) if folder.is_dir() else []


def running_past_checkpoint(tmp_path: Path, name: str, step: int = 2):
    """(run dir, status) of the sweep's first run once it is running with checkpoint-<step> complete, else None."""
    from stare_lab.record import read_status

    dirs = run_dirs(tmp_path, name)
    s = read_status(dirs[0]) if dirs else None
    done = dirs and (dirs[0] / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").is_file()
    return (dirs[0], s) if s and s["state"] == "running" and done else None


# -- substituting the runner ------------------------------------------------------------------


class RunnerPatch:
    """A submitted job's callable: in the job's process, the worker's runner becomes `runner`,
    then `fn` (the launcher's QueueWorker or RunWorker) runs. Picklable by reference (this module
    is importable in the jobs: sweep_env puts the test folders on PYTHONPATH). A requeued Checkpointable
    job stays patched."""

    def __init__(self, fn, runner):
        self.fn, self.runner = fn, runner

    def __call__(self, *args, **kwargs):
        from stare_lab.sweep import worker

        worker.execute_run = self.runner
        return self.fn(*args, **kwargs)

    def __getattr__(self, name):  # submitit checkpoints a job whose callable has `checkpoint`
        if name == "checkpoint" and hasattr(self.__dict__.get("fn"), "checkpoint"):
            return self._checkpoint
        raise AttributeError(name)

    def _checkpoint(self, *args, **kwargs):
        delayed = self.fn.checkpoint(*args, **kwargs)
        delayed.function = RunnerPatch(delayed.function, self.runner)
        return delayed


def use_runner(runner, set_attr=setattr) -> None:
    """Workers run `runner(run_dir)` in place of stare_lab.run.runner.execute: in this process and in
    every job submitted from it. `set_attr`: pytest's `monkeypatch.setattr` (undone after the
    test) or `setattr` (a driver process of its own)."""
    from submitit.core.core import Executor

    from stare_lab.sweep import worker

    submit = Executor.submit

    def submit_patched(self, fn, *args, **kwargs):
        return submit(self, RunnerPatch(fn, runner), *args, **kwargs)

    set_attr(worker, "execute_run", runner)
    set_attr(Executor, "submit", submit_patched)


# -- the stand-in runner ----------------------------------------------------------------------


def standin_execute(run_dir: Path, step_s: float = 0.05, fail_at: int = 0, only: str | None = None) -> None:
    """Steps of `step_s` seconds; the runner's checkpoint/resume/metrics contract. `fail_at`: crash
    at that step (in runs of method `only`, when given)."""
    run_dir = Path(run_dir)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    if only is not None and cfg["method"]["name"] != only:
        fail_at = 0
    t = cfg["trainer"]
    if cfg["task"]["name"] not in ("arithmetic", "math"):
        raise ValueError(f"task.name: unknown task {cfg['task']['name']!r}")
    ckpts = [
        int(p.name.split("-")[1])
        for p in (run_dir / "checkpoints").glob("checkpoint-*")
        if (p / "trainer_state.json").is_file()
    ]
    last = max(ckpts, default=0)
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= last))
    value = _standin_value(cfg)
    for step in range(last + 1, t["max_steps"] + 1):
        time.sleep(step_s)
        if fail_at and step >= fail_at:
            raise RuntimeError(f"simulated crash at step {step}")
        with metrics.open("a") as f:
            f.write(json.dumps({"step": step, "time": time.time(), "reward": value * step / t["max_steps"]}) + "\n")
        if step % t["save_steps"] == 0 or step == t["max_steps"]:
            d = run_dir / "checkpoints" / f"checkpoint-{step}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        every = cfg["eval"].get("every_steps") or 0
        if every and step % every == 0:
            _write_eval(run_dir / "eval" / f"step-{step}", cfg, value * step / t["max_steps"])
    _write_eval(run_dir / "eval", cfg, value)


def standin_deaf_to_sigterm(run_dir: Path, step_s: float = 0.05) -> None:
    """standin_execute in a worker that does not end on SIGTERM: as one whose main thread is inside a
    call that does not return to Python (a long training step on a busy node) for as long as the
    driver waits. It ignores SIGTERM from the run's start; only SIGKILL ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    standin_execute(run_dir, step_s)


def standin_after_meeting(run_dir: Path, meet_dir: str, workers: int = 2, timeout: float = 120.0) -> None:
    """standin_execute, but a worker process's first run waits (up to `timeout` s) until `workers`
    processes have each begun a run: a test of sharing then does not depend on how fast the second
    worker starts on a loaded machine (one worker could otherwise drain the queue first)."""
    meet = Path(meet_dir)
    meet.mkdir(parents=True, exist_ok=True)
    mine = meet / str(os.getpid())
    if not mine.exists():
        mine.touch()
        deadline = time.monotonic() + timeout
        while len(list(meet.iterdir())) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
    standin_execute(run_dir)


class FailAt:
    """A TrainerCallback for the real runner: raise at optimizer step N, like a crashing job."""

    def __new__(cls, step: int):
        from transformers import TrainerCallback

        class _FailAt(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step >= step:
                    raise RuntimeError(f"simulated crash at step {state.global_step}")
                return control

        return _FailAt()


def crash_method_random(run_dir: Path) -> None:
    """The real runner; a run of method `random` crashes at step 1."""
    from stare_lab.run.runner import execute

    method = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())["method"]["name"]
    execute(run_dir, callbacks=[FailAt(1)] if method == "random" else [])


def crash_array_task_1(run_dir: Path) -> None:
    """The real runner; the Slurm array's task 1 crashes at step 1 (a job failing on its own)."""
    from stare_lab.run.runner import execute

    execute(run_dir, callbacks=[FailAt(1)] if os.environ.get("SLURM_ARRAY_TASK_ID") == "1" else [])


def _standin_value(cfg: dict) -> float:
    """A smooth function of the rule's numeric params, best near 0.2 each (a search has a target)."""
    nums = [v for v in cfg["method"]["params"].values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return 1.0 / (1.0 + sum(abs(v - 0.2) for v in nums))


def _write_eval(folder: Path, cfg: dict, value: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    n = cfg["eval"]["n"]
    for bench in cfg["eval"]["benchmarks"]:
        (folder / f"{bench}.json").write_text(json.dumps({"benchmark": bench, "n": n, "metrics": {f"avg@{n}": value}}))


if __name__ == "__main__":
    import functools

    sys.path.insert(0, str(ROOT))
    from stare_lab.cli.sweep import main

    argv = sys.argv[1:]
    if argv[:1] in (["--standin"], ["--standin-deaf"]):
        import sweep_fixtures  # pickled by module name: workers can not import this __main__

        runner = (
            sweep_fixtures.standin_deaf_to_sigterm if argv[0] == "--standin-deaf" else sweep_fixtures.standin_execute
        )
        sweep_fixtures.use_runner(functools.partial(runner, step_s=float(argv[1])))
        argv = argv[2:]
    sys.exit(main(argv))


# -- the stand-in for the whole sweep suite ----------------------------------------------------

# STARE_LAB_SWEEP_TESTS_STANDIN=1 swaps the stand-in runner in for the real one in the sweep tests that
# run the real runner by default (same resume contract, no model): faster, for development.
STANDIN = os.environ.get("STARE_LAB_SWEEP_TESTS_STANDIN") == "1"
STANDIN_STEP_S = 0.3 if STANDIN else None
EXECUTE = functools.partial(standin_execute, step_s=0.3) if STANDIN else None


def read_json_lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# -- the local Slurm cluster ------------------------------------------------------------------


def squeue_state(job: str) -> str:
    """Slurm's state of `job` ("" once it has left the queue)."""
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def node_idle() -> bool:
    """Whether the cluster's nodes are all idle (no job left on them)."""
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.split() == ["idle"]


def requeue_and_release(job: str) -> None:
    """`scontrol requeue` a running job, then start it again without Slurm's ~2-minute hold.

    Released at once, the job can be re-allocated before slurmd has cleaned up the first attempt
    ("Killing non-startable batch job: Job credential revoked"); that is what Slurm's own hold
    (BeginTime) avoids. So: wait for the job to be pending and the node idle again, then a little more."""
    subprocess.run(["scontrol", "requeue", job], check=True)
    wait_until(lambda: squeue_state(job) == "PENDING", 60, "the requeued job to be pending", every=0.2)
    wait_until(node_idle, 120, "the node to finish cleaning up the first attempt", every=0.5)
    time.sleep(5)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)


UNKNOWN_JOB = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"  # squeue's answer, no job known


def fake_sacct(tmp_path, monkeypatch, body: str, squeue: str = UNKNOWN_JOB) -> Path:
    """A `sacct` on PATH that logs its arguments and runs `body` (shell), and a `squeue` that runs
    `squeue` (by default: it knows no job); returns the log, one line per call of either."""
    bin_dir, log = tmp_path / "bin", tmp_path / "sacct.log"
    bin_dir.mkdir()
    for name, text in (("sacct", body), ("squeue", squeue)):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho {name} "$@" >> {log}\n{text}\n')
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log
