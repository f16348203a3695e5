"""The run record module: light imports, status/metrics/checkpoint readers on damaged files, the claim,
and the one liveness policy shared by `sweep run` and `sweep status`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stare_lab.launchers.liveness import Liveness, process_start
from stare_lab.record import (
    CORRUPT,
    RunClaim,
    checkpoint_problem,
    claim_held,
    last_checkpoint,
    read_status,
    scan_metrics,
    truncate_metrics,
    update_status,
    write_status,
)

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "trl")


@pytest.mark.parametrize(
    "module",
    [
        "stare_lab.record",
        "stare_lab.plan.status",
        "stare_lab.cli.sweep",
        "stare_lab.record.frames",
        "stare_lab.analysis.tables",
        "stare_lab.analysis.plots",
        "stare_lab.analysis",
    ],
)
def test_record_status_and_analysis_import_no_torch(module):
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"


def test_importing_the_runner_changes_no_process_settings():
    # libraries add filters of their own on import (sympy, transformers); ours is FutureWarning of transformers
    code = (
        "import torch, warnings; n = torch.get_num_threads(); "
        "import stare_lab.run.runner, stare_lab.sweep.worker; "
        "ours = [f for f in warnings.filters if f[2] is FutureWarning and 'transformers' in str(f[3])]; "
        "print(torch.get_num_threads() == n, not ours)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "STARE_LAB_THREADS": "1"},
    )
    assert out.stdout.split()[-2:] == ["True", "True"]


def test_a_garbled_status_is_reported_and_kept_never_read_as_missing(tmp_path):
    assert read_status(tmp_path) is None
    (tmp_path / "status.json").write_text('{"state": "runn')
    status = read_status(tmp_path)
    assert status["state"] == CORRUPT and "status.json: not JSON" in status["error"]
    (tmp_path / "status.json").write_text('{"state": "sleeping"}')
    assert read_status(tmp_path)["state"] == CORRUPT
    update_status(tmp_path, state="pending")  # a new record, the bad one set aside
    assert read_status(tmp_path)["state"] == "pending"
    (kept,) = tmp_path.glob("status.json.bad-*")
    assert kept.read_text() == '{"state": "sleeping"}'


def test_metrics_scan_names_bad_lines_and_truncation_keeps_damaged_files(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew\n{"step": 3, "reward": 0.7}\n{"step": 4, "re')
    rows, bad = scan_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 3] and [n for n, _ in bad] == [2, 4]
    dropped, kept = truncate_metrics(path, 3)
    assert dropped == 0 and kept is not None and kept.read_text().count("\n") == 3  # the original, whole
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 3]
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3')  # only a torn last row
    assert truncate_metrics(path, 1) == (1, None)
    assert path.read_text() == '{"step": 1}\n'


def _checkpoint(run_dir: Path, step: int, weights: bytes) -> Path:
    d = run_dir / "checkpoints" / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (d / "model.safetensors").write_bytes(weights)
    return d


def _safetensors(n_floats: int) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]}}).encode()
    return len(header).to_bytes(8, "little") + header + b"\0" * (4 * n_floats)


def test_a_truncated_newest_checkpoint_is_named_and_skipped(tmp_path):
    good = _checkpoint(tmp_path, 2, _safetensors(16))
    bad = _checkpoint(tmp_path, 4, _safetensors(16)[:-10])
    assert checkpoint_problem(good) is None
    assert checkpoint_problem(bad) == "model.safetensors: truncated (125 bytes, 135 expected)"
    problems: list[str] = []
    assert last_checkpoint(tmp_path, problems) == good
    assert problems == ["checkpoint-4 is unreadable (model.safetensors: truncated (125 bytes, 135 expected))"]
    (bad / "model.safetensors").write_bytes(b"\x05")
    assert "no header" in checkpoint_problem(bad)


def _holder(run_dir: Path) -> subprocess.Popen:
    code = (
        f"import time; from stare_lab.record import RunClaim; c = RunClaim({str(run_dir)!r}); "
        "print(c.acquire(0), flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "True"
    return proc


def test_one_claim_per_run_released_when_its_holder_dies(tmp_path):
    holder = _holder(tmp_path)
    try:
        assert claim_held(tmp_path)
        assert RunClaim(tmp_path).acquire(wait_s=0.2) is False
    finally:
        holder.kill()
        holder.wait()
    assert not claim_held(tmp_path)
    claim = RunClaim(tmp_path)
    assert claim.acquire() and claim_held(tmp_path)
    claim.release()
    assert not claim_held(tmp_path)


def test_liveness_policy(tmp_path):
    me = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": process_start(os.getpid())}
    live = Liveness(socket.gethostname(), slurm=None, launcher_alive=False)
    assert live.alive(tmp_path, {"state": "running", **me})
    assert not live.alive(tmp_path, {"state": "finished", **me})
    assert not live.alive(tmp_path, {"state": "running", **me, "pid_start": "1"})  # a reused pid
    other_host = {"state": "running", "host": "elsewhere", "pid": os.getpid(), "pid_start": "1"}
    assert not live.alive(tmp_path, other_host)  # no Slurm, no claim: its worker is gone
    holder = _holder(tmp_path)
    try:
        assert live.alive(tmp_path, other_host)  # ... unless it holds the run's claim
    finally:
        holder.kill()
        holder.wait()
    assert not live.alive(tmp_path, {"state": "pending"})
    assert Liveness("h", None, launcher_alive=True).alive(tmp_path, {"state": "pending"})
    job = {"state": "pending", "slurm_job_id": "7_1"}
    assert Liveness("h", None, False).alive(tmp_path, job)  # Slurm did not answer: don't guess
    assert Liveness("h", {"7_1": "PENDING"}, False).alive(tmp_path, job)
    assert not Liveness("h", {"7_1": "COMPLETED"}, False).alive(tmp_path, job)
    assert not Liveness("h", {}, False).alive(tmp_path, job)


def test_write_then_read_status_roundtrip(tmp_path):
    write_status(tmp_path, {"state": "failed", "attempts": 2, "error": "x"})
    assert read_status(tmp_path) == {"state": "failed", "attempts": 2, "error": "x"}
