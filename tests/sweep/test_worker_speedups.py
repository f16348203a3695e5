"""What the demo's speed-ups change, and what they must not: the load probe is skipped only where it can
not change a worker's threads; `start_forked` gives the same answers as running the calls here, from
other processes; a run of 0 steps is named as such when it has no kept batch (docs/demo.md, "Where the
time goes")."""

from __future__ import annotations

import os

import pytest
import yaml

from stare_lab.core.utils import start_forked
from stare_lab.launchers.threads import WorkerThreads, usable_cpus
from stare_lab.record import CONFIG_FILE, write_status
from stare_lab.record.kept_batch import UNTRAINED, why_no_batch
from stare_lab.sweep import worker


def _probe_counted(monkeypatch, busy: float) -> list[int]:
    calls: list[int] = []

    def probe() -> float:
        calls.append(1)
        return busy

    monkeypatch.setattr(worker, "busy_elsewhere", probe)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return calls


def test_no_load_probe_where_the_share_is_one_thread(monkeypatch):
    calls = _probe_counted(monkeypatch, busy=0.0)
    monkeypatch.setattr(worker, "_PLAN", [WorkerThreads(sharing=usable_cpus())])  # one thread each
    assert worker.run_threads()["torch"] == 1
    assert calls == []


@pytest.mark.skipif(usable_cpus() < 2, reason="needs 2 usable cores: with one, every share is one thread")
def test_load_probe_lowers_the_threads_where_the_share_is_more(monkeypatch):
    calls = _probe_counted(monkeypatch, busy=float(usable_cpus() - 1))  # others keep all but one core busy
    monkeypatch.setattr(worker, "_PLAN", [WorkerThreads(sharing=1)])
    record = worker.run_threads()
    assert calls == [1]
    assert record["torch"] == 1 and "busy with other processes" in record["from"]


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


@pytest.mark.parametrize("processes", [0, 1, 2])
def test_start_forked_answers_in_order(processes):
    wait = start_forked(_square_and_pid, [(x,) for x in range(5)], processes)
    answers = wait()
    assert [square for square, _ in answers] == [0, 1, 4, 9, 16]
    pids = {pid for _, pid in answers}
    if processes == 0:
        assert pids == {os.getpid()}
    else:
        assert os.getpid() not in pids and 1 <= len(pids) <= processes


def test_a_run_of_zero_steps_is_named_untrained(tmp_path):
    for steps, expected in ((0, UNTRAINED), (30, "trainer.keep_batches_every is 0: set it to keep batches")):
        run = tmp_path / f"steps{steps}"
        run.mkdir()
        config = {"method": {"name": "base"}, "trainer": {"max_steps": steps, "keep_batches_every": 0}}
        (run / CONFIG_FILE).write_text(yaml.safe_dump(config))
        write_status(run, {"state": "finished"})
        assert why_no_batch(run) == expected
