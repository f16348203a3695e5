"""The server slot's watch (stare_lab.sweep.server_task): it ends with the run's attempt, and fails with
one line when the server's process exits first. Real processes stand in for the server (no vLLM here;
tests/vllm_tests run the real one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stare_lab.record import new_status, update_status, write_status
from stare_lab.serving.vllm_server import Server, ServerError
from stare_lab.sweep import server_task


@pytest.fixture
def running_run(tmp_path):
    run_dir = tmp_path / "r"
    write_status(run_dir, {**new_status(), "state": "running", "attempts": 1})
    return run_dir


def test_the_watch_fails_with_the_servers_exit_code_when_the_server_dies_first(tmp_path, running_run):
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait(timeout=60)
    server = Server(dead, "127.0.0.1", 8000, tmp_path / "vllm_server.log")
    with pytest.raises(ServerError) as e:
        server_task._watch(running_run, server, 1)
    assert str(e.value) == f"vLLM server at http://127.0.0.1:8000 exited with code 3 mid-run (log: {server.log})"


def test_the_watch_ends_when_the_attempt_is_no_longer_running(tmp_path, running_run, monkeypatch):
    monkeypatch.setattr(server_task, "WATCH_EVERY_S", 0.05)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        update_status(running_run, state="interrupted")
        server_task._watch(running_run, Server(alive, "127.0.0.1", 8000, tmp_path / "log"), 1)  # returns
        update_status(running_run, state="running", attempts=2)  # a later attempt: not the one watched
        server_task._watch(running_run, Server(alive, "127.0.0.1", 8000, tmp_path / "log"), 1)
        assert alive.poll() is None  # the watch stops nothing itself: `serving` stops the server
    finally:
        alive.kill()
        alive.wait()
