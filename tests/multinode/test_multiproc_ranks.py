"""The rank files of a multi-process run (stare_lab.launchers.ranks) and the worker's use of them,
without starting torch.distributed: rank 0 alone claims and records; the other ranks follow its
go, never the claim; a dead rank's line (or its death) becomes the run's error; a requeue is not a
failure. Seconds."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from stare_lab.launchers.ranks import RankGate, is_echo, latest_peer_failure
from stare_lab.record import RunClaim, new_status, read_status, write_status
from stare_lab.sweep import worker
from stare_lab.sweep.worker import run_one, run_rank


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture(autouse=True)
def run_config(tmp_path):
    """A run folder has its config.yaml: the worker reads the run's rule and `run.imports` from it."""
    (tmp_path / "config.yaml").write_text("method: {name: full}\n")


def test_go_no_go_and_a_silent_rank_0_is_bounded(tmp_path):
    zero, one = RankGate(tmp_path, "7-0", 0, 2), RankGate(tmp_path, "7-0", 1, 2)
    t0 = time.time()
    with pytest.raises(RuntimeError, match="rank 1: rank 0 did not start the run within 1 s"):
        one.wait_open(timeout_s=1.0)
    assert time.time() - t0 >= 1.0  # it waited its window, then gave up (no upper bound: load-dependent)
    zero.open(False, "finished")
    assert one.wait_open(1.0) == (False, "finished")
    zero.open(True)
    assert one.wait_open(1.0) == (True, "")


def test_peer_failure_prefers_the_first_error_line_then_a_dead_pid(tmp_path):
    zero, one, two = (RankGate(tmp_path, "k", r, 3) for r in range(3))
    for g in (zero, one, two):
        g.started()
    assert zero.peer_failure(wait_s=0.2) is None  # everyone alive and quiet
    one._write_rank({"host": __import__("socket").gethostname(), "pid": _dead_pid(), "error": None})
    dead = zero.peer_failure(wait_s=0.2)
    assert dead.startswith("rank 1 (pid ") and "died without an error line" in dead
    assert zero.peer_failure(wait_s=0.2, count_dead=False) is None  # SIGTERM: a requeue, not a failure
    two.failed("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\nmore lines")
    assert zero.peer_failure(wait_s=0.2) == "rank 2: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert latest_peer_failure(tmp_path) == "rank 2: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_echo_errors_are_the_peers_death_not_rank_0s_own():
    assert is_echo(
        "RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:41858: Connection reset by peer"
    )
    assert is_echo("DistBackendError: NCCL communicator was aborted on rank 0")
    assert not is_echo("NonFiniteError: step 3: loss=nan became non-finite; run stopped")


def runner(monkeypatch, execute) -> None:
    """The worker runs `execute` in place of the real runner (its one call: worker.execute_run)."""
    monkeypatch.setattr(worker, "execute_run", execute)


def test_rank_0_claims_and_records_the_others_follow_it(tmp_path, monkeypatch):
    calls = []
    write_status(tmp_path, new_status())
    runner(monkeypatch, lambda d: calls.append("rank0"))
    status = run_one(tmp_path, gate=RankGate(tmp_path, "k", 0, 2))
    assert status["state"] == "finished" and status["world_size"] == 2 and calls == ["rank0"]
    # the run is finished: rank 0 says no, rank 1 leaves without running anything
    runner(monkeypatch, lambda d: calls.append("again"))
    assert run_one(tmp_path, gate=RankGate(tmp_path, "k2", 0, 2))["state"] == "finished"
    runner(monkeypatch, lambda d: calls.append("rank1"))
    assert run_rank(tmp_path, 1, 2, "k2") == {"rank": 1, "skipped": "finished"}
    assert calls == ["rank0"]


def test_a_rank_0_that_finds_the_claim_held_stops_the_other_ranks(tmp_path, monkeypatch):
    write_status(tmp_path, new_status())
    runner(monkeypatch, lambda d: None)
    other = RunClaim(tmp_path)
    assert other.acquire()
    try:
        out = run_one(tmp_path, gate=RankGate(tmp_path, "k", 0, 2))
        assert out["claimed_elsewhere"]
        assert run_rank(tmp_path, 1, 2, "k")["skipped"] == "another worker holds the run"
    finally:
        other.release()


def test_rank_0_records_the_dead_peers_line_not_its_own_echo(tmp_path, monkeypatch):
    write_status(tmp_path, new_status())
    peer = RankGate(tmp_path, "k", 1, 2)
    peer.started()

    def echo(run_dir):
        peer.failed("ValueError: bad shard on rank 1")
        raise RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:5000")

    with pytest.raises(RuntimeError):
        runner(monkeypatch, echo)
        run_one(tmp_path, gate=RankGate(tmp_path, "k", 0, 2))
    s = read_status(tmp_path)
    assert s["state"] == "failed" and s["error"] == "rank 1: ValueError: bad shard on rank 1"


def test_a_non_zero_rank_writes_its_first_error_line(tmp_path, monkeypatch):
    RankGate(tmp_path, "k", 0, 2).open(True)

    def boom(run_dir):
        raise RuntimeError("missing shard\nsecond line")

    with pytest.raises(RuntimeError):
        runner(monkeypatch, boom)
        run_rank(tmp_path, 1, 2, "k")
    assert latest_peer_failure(tmp_path) == "rank 1: RuntimeError: missing shard"
    assert read_status(tmp_path) is None  # rank 1 never writes status.json
