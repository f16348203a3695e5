"""Provenance: every attempt records the code and libraries that ran it; `sweep run`, `sweep status` and
`stare-lab table` say when finished runs came from other code, and `--rerun-other-code` redoes them."""

from __future__ import annotations

import functools
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import fixtures_runs as fx
from sweep_fixtures import metric_steps, run_dirs, standin_execute, standin_run_dir, use_runner, write_sweep

from stare_lab.analysis import collect_runs, results_table, run_states
from stare_lab.cli.sweep import main as sweep_main
from stare_lab.record import code_version, provenance, read_status, write_status
from stare_lab.sweep.worker import run_one

ROOT = Path(__file__).resolve().parents[2]
EXECUTE = functools.partial(standin_execute, step_s=0.01)


def head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def test_each_attempt_records_code_libraries_python_and_device(tmp_path, monkeypatch):
    use_runner(EXECUTE, monkeypatch.setattr)
    run_dir = standin_run_dir(tmp_path)
    run_one(run_dir)
    run_one(run_dir, force=True)
    attempts = read_status(run_dir)["provenance"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    p = attempts[-1]
    assert p["commit"] == head() and isinstance(p["dirty"], bool)
    assert p["versions"] == {
        name: metadata.version(name) for name in ("torch", "transformers", "trl", "peft", "accelerate")
    }
    assert p["python"] == platform.python_version() and p["device"].startswith("cpu (")
    assert code_version(read_status(run_dir)) == head()[:10] + ("+dirty" if p["dirty"] else "")


def test_sweep_run_and_status_name_runs_from_other_code_and_rerun_redoes_them(
    tmp_path,
    in_process_env,
    capsys,
    monkeypatch,
):
    use_runner(EXECUTE, monkeypatch.setattr)
    path = write_sweep(
        tmp_path, "prov", grid={"method": ["full", "top_entropy"]}, launcher={"name": "local", "workers": 2}
    )
    assert sweep_main(["sweep", "run", str(path)]) == 0
    old, same = run_dirs(tmp_path, "prov")
    status = read_status(old)
    status["provenance"][-1].update(commit="0123456789abcdef", dirty=False)  # as if an older checkout ran it
    write_status(old, status)
    capsys.readouterr()

    assert sweep_main(["sweep", "status", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning: finished runs come from different code versions (0123456789: 1 run" in out
    assert sweep_main(["sweep", "run", str(path)]) == 0  # told, not redone
    out = capsys.readouterr().out
    assert "note: 1 finished run(s) came from other code than" in out and "(0123456789: 1)" in out
    assert read_status(old)["attempts"] == 1

    assert sweep_main(["sweep", "run", str(path), "--rerun-other-code"]) == 0
    assert "1 to run (1 rerun)" in capsys.readouterr().out
    redone = read_status(old)
    assert redone["attempts"] == 1 and code_version(redone) == code_version(provenance())
    assert metric_steps(old) == [1, 2] and read_status(same)["attempts"] == 1
    (superseded,) = (tmp_path / "runs" / "prov" / ".superseded").iterdir()
    assert (
        superseded.name.startswith(old.name)
        and json.loads((superseded / "status.json").read_text())["provenance"][-1]["commit"] == "0123456789abcdef"
    )


def test_table_warns_when_runs_come_from_different_code(tmp_path):
    root = fx.write_sweep(tmp_path)
    for i, run in enumerate(sorted(root.iterdir())):
        status = json.loads((run / "status.json").read_text())
        status["provenance"] = [{"attempt": 1, "commit": "a" * 40 if i < 2 else "b" * 40, "dirty": False}]
        (run / "status.json").write_text(json.dumps(status))
    table = results_table(collect_runs(root), expected=run_states(root))
    assert "Warning: runs come from different code versions: aaaaaaaaaa (2 runs), bbbbbbbbbb (6 runs)." in table.notes
