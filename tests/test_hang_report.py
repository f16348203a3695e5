"""A wait that times out says where every process was (tests/support/hang_report.py), here on a real
child that ends at once while the grandchild it started keeps the pipe being read open."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import hang_report
import pytest
from sweep_fixtures import wait_until

GRANDCHILD = textwrap.dedent(
    """
    import time
    def holds_the_pipe():
        time.sleep(120)
    holds_the_pipe()
    """
)
CHILD = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}])"


def test_a_timed_out_communicate_names_the_grandchild_holding_the_pipe_and_its_stack(monkeypatch, capfd):
    monkeypatch.setattr(hang_report, "REPORT_AFTER_S", 1.0)
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        proc.wait(timeout=60)  # the child itself ends at once
        with pytest.raises(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)  # the pipe stays open: the grandchild holds it
        err = capfd.readouterr().err
        holders = hang_report.pipe_holders(proc.stdout)
        assert len(holders) == 1 and holders[0] != proc.pid
        assert f"---- holding the pipe read: [{holders[0]}]" in err
        assert "holds_the_pipe" in err and "(<string>:" in err, err  # its Python stack, by py-spy
        assert err.count("==== communicate(timeout=5) timed out") == 1  # the inner wait() did not report again
    finally:
        for pid in hang_report.pipe_holders(proc.stdout):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        proc.communicate(timeout=30)


def test_a_short_wait_reports_nothing(capfd):
    """`wait(timeout=0.2)` asks whether a process still runs: no report, no py-spy."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        assert "====" not in capfd.readouterr().err
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_wait_until_reports_the_test_s_children_when_it_gives_up(capfd):
    proc = subprocess.Popen([sys.executable, "-c", GRANDCHILD])
    try:
        with pytest.raises(AssertionError, match="timed out after 1s waiting for nothing"):
            wait_until(lambda: False, 1, "nothing", every=0.2)
        err = capfd.readouterr().err
        assert f"pid {proc.pid} " in err and "holds_the_pipe" in err, err
    finally:
        proc.kill()
        proc.wait(timeout=30)
