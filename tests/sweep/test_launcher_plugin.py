"""A new launcher is one module: registering it from a file of its own (tests/support/launcher_plugin_example.py)
makes it a `launcher:` name of a sweep YAML and of `--launcher`, validated like the built-in ones,
and it runs a sweep; no other file changes. The registry is restored after each test."""

from __future__ import annotations

import functools
import importlib
import sys

import pytest
from sweep_fixtures import run_dirs, standin_execute, use_runner, write_sweep

from stare_lab.cli.sweep import main
from stare_lab.launchers import base
from stare_lab.plan.schema import SweepError, load_sweep
from stare_lab.record import read_status


@pytest.fixture
def plugin(monkeypatch):
    """The plugin module, imported afresh into a copy of the registry (undone after the test)."""
    monkeypatch.setattr(base, "LAUNCHERS", dict(base.LAUNCHERS))
    monkeypatch.delitem(sys.modules, "launcher_plugin_example", raising=False)
    module = importlib.import_module("launcher_plugin_example")
    yield module
    sys.modules.pop("launcher_plugin_example", None)


def test_a_launcher_from_its_own_file_is_picked_by_name_and_validated(tmp_path, plugin):
    assert base.launcher_names() == ("local", "slurm", plugin.NAME)
    spec = load_sweep(write_sweep(tmp_path, launcher={"name": plugin.NAME, "slots": 3}))
    assert type(spec.launcher) is plugin.PluginLauncher
    assert (spec.launcher.slots, spec.launcher.minutes) == (3, 60.0)  # its own default
    assert spec.launcher.with_parallel_runs(5).slots == 5 and spec.launcher.processes_per_run == 1
    where = str(tmp_path / "bad.yaml")
    with pytest.raises(SweepError) as e:
        load_sweep(write_sweep(tmp_path, "bad", launcher={"name": plugin.NAME, "slots": 0}))
    assert str(e.value) == f"{where}: launcher.slots: must be ≥ 1, got 0"
    with pytest.raises(SweepError) as e:
        load_sweep(write_sweep(tmp_path, "bad", launcher={"name": plugin.NAME, "workers": 2}))
    assert str(e.value) == (
        f"{where}: launcher.workers: unknown key for the {plugin.NAME} launcher; valid keys: minutes, slots"
    )
    with pytest.raises(SweepError, match=rf"unknown launcher 'nope'; valid: local, slurm, {plugin.NAME}$"):
        load_sweep(write_sweep(tmp_path, "bad", launcher={"name": "nope"}))


def test_the_command_line_knows_it_and_a_sweep_runs_through_it(tmp_path, plugin, in_process_env, capsys, monkeypatch):
    path = write_sweep(tmp_path, "plug", grid={"method": ["full", "random"]})
    assert main(["sweep", "run", str(path), "--launcher", plugin.NAME, "--workers", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"launcher {plugin.NAME}: slots=2, minutes=60.0\nprocesses per run: 1; 2 runs at once (2 slots)\n" in out

    path = write_sweep(
        tmp_path, "plug", grid={"method": ["full", "random"]}, launcher={"name": plugin.NAME, "slots": 2}
    )
    use_runner(functools.partial(standin_execute, step_s=0.01), monkeypatch.setattr)
    assert main(["sweep", "run", str(path)]) == 0
    assert f"sweep 'plug' ({plugin.NAME}, 2 runs" in capsys.readouterr().out
    statuses = [read_status(d) for d in run_dirs(tmp_path, "plug")]
    assert len(statuses) == 2 and all(s["state"] == "finished" and s["attempts"] == 1 for s in statuses)
    assert len({s["pid"] for s in statuses}) == 2  # one job per run, not queue workers
