"""`stare-lab ... | head`: a reader that goes before the output ends ends the command quietly, status 141.

Each command runs in a real subprocess. `| head -1`: its stdout is a pipe of one page (F_SETPIPE_SZ); the
test reads one line and closes its end while more than a page is still to come, so the command's next
write meets EPIPE whatever the machine's speed (a short output would be in the pipe whole before the
reader went). `| true`: the pipe's read end is closed before the command starts, so its first write
meets EPIPE, whatever the output's length.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import fixtures_runs as fx
import numpy as np
import pytest
import yaml
from claims_fixtures import simulate_problems, sweep_file, write_records
from sweep_fixtures import ROOT, sweep_env

from stare_lab.cli import EXIT_READER_GONE

PAGE = 4096  # the smallest pipe Linux allows
COMMAND = [sys.executable, "-m", "stare_lab.cli"]


def first_line_then_close(args: list[str]) -> tuple[str, str, int]:
    """(stdout's first line, stderr, exit status) of `stare-lab ARGS | head -1`."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PAGE)
    proc = subprocess.Popen([*COMMAND, *args], cwd=ROOT, env=sweep_env(), stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    line = b""
    while not line.endswith(b"\n"):  # byte by byte: the test takes no more than the line from the pipe
        byte = os.read(read_end, 1)
        if not byte:
            break
        line += byte
    os.close(read_end)
    _, err = proc.communicate(timeout=120)
    return line.decode(), err.decode(), proc.returncode


def without_reader(args: list[str], stream: str = "stdout") -> tuple[str, int]:
    """(what the other stream got, exit status) of `stare-lab ARGS` whose `stream` has no reader from the start."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, stream: write_end}
    proc = subprocess.Popen([*COMMAND, *args], cwd=ROOT, env=sweep_env(), **streams)
    os.close(write_end)
    out, err = proc.communicate(timeout=120)
    return (err if stream == "stdout" else out).decode(), proc.returncode


def many_arms(root: Path, arms: int) -> Path:
    """A sweep of `arms` stare arms (W = 1.000, 1.001, ...) × 2 seeds on aime24: a table of `arms` rows."""
    sweep = root / fx.SWEEP
    sweep.mkdir(parents=True)
    for i in range(arms):
        for seed in (1, 2):
            rid = f"stare{i}-s{seed}"
            config = {"method.params.W": 1.0 + i / 1000, "run.id": rid}
            made = fx.write_run(root / "scratch", "stare", None, seed, evals={"aime24": 0.2}, extra_config=config)
            made.rename(sweep / rid)  # fx.write_run names its folder by method and seed alone
    return sweep


def seeds_sweep(tmp_path: Path, seeds: int) -> Path:
    """A sweep file of `seeds` runs of `full` on the built-in model, its output folder made (no run started)."""
    path = tmp_path / "g.yaml"
    data = {"name": "g", "base": {"model": "builtin", "logger": "none"}, "seeds": list(range(seeds))}
    path.write_text(yaml.safe_dump({**data, "output": str(tmp_path / "runs")}))
    return path


def test_table_into_a_reader_that_leaves_ends_quietly_with_141(tmp_path):
    sweep = many_arms(tmp_path, 120)  # ~6 KB of table
    line, err, rc = first_line_then_close(["table", str(sweep), "--baseline", "none"])
    assert line == "Table: avg@32 in %, 120 arms × 2 seeds; mean ± std over seeds, no intervals.\n"
    assert err == ""  # no traceback, no "Exception ignored", no error line
    assert rc == EXIT_READER_GONE == 141


def test_sweep_status_into_a_reader_that_leaves_ends_quietly_with_141(tmp_path):
    path = seeds_sweep(tmp_path, 300)
    (tmp_path / "runs" / "g").mkdir(parents=True)  # a folder of no records: every planned run listed, ~8 KB
    line, err, rc = first_line_then_close(["sweep", "status", str(path)])
    assert line == "sweep 'g': 300 runs — 300 not started\n"
    assert err == ""
    assert rc == 141


def test_a_dry_run_into_a_reader_that_leaves_ends_quietly_with_141(tmp_path):
    """rich's table meets the reader's end as print does, and the sweep driver's `except OSError` (a disk
    that filled up) does not take EPIPE for a failed write of records: no error line, the same 141."""
    path = seeds_sweep(tmp_path, 150)
    line, err, rc = first_line_then_close(["sweep", "run", str(path), "--dry-run"])
    assert line == f"sweep g: 150 runs → {tmp_path / 'runs' / 'g'}\n"
    assert err == ""
    assert rc == 141
    assert not (tmp_path / "runs").exists()


def test_claims_without_a_reader_ends_quietly_with_141(tmp_path):
    """`claims` had its own BrokenPipe handler, which closed stderr and exited 0: now the one mechanism's."""
    arms = {a: {"method": a} for a in ("full", "stare")}
    claim = {"id": "stare_beats_full", "source": "own", "form": "superiority", "a": "stare", "b": "full",
             "quantity": {"score": "avg@32", "benchmarks": ["arithmetic"]}}  # fmt: skip
    path = sweep_file(tmp_path, "cl", arms, [0, 1], [claim])
    write_records(path, simulate_problems({"full": 0.0, "stare": 20.0}, np.random.default_rng(0), seeds=[0, 1]), None)
    assert (
        subprocess.run([*COMMAND, "claims", str(path)], cwd=ROOT, env=sweep_env(), capture_output=True).returncode == 0
    )
    err, rc = without_reader(["claims", str(path)])
    assert err == ""
    assert rc == 141


def test_a_refusal_whose_stderr_has_no_reader_ends_with_141(tmp_path):
    out, rc = without_reader(["table", str(tmp_path / "missing.yaml")], stream="stderr")
    assert out == ""
    assert rc == 141  # not Python's 1 (the traceback of a BrokenPipeError) or 120 (its failed last flush)


@pytest.mark.parametrize("args", [["--help"], ["sweep", "status", "--help"]])
def test_a_reader_that_stays_gets_everything_and_status_0(args):
    out = subprocess.run([*COMMAND, *args], cwd=ROOT, env=sweep_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == ""
    if args == ["--help"]:
        assert out.stdout.startswith("stare-lab: the command line") and "exit 141 as `yes | head`" in out.stdout
    else:
        assert out.stdout.startswith("usage: stare-lab sweep status")
