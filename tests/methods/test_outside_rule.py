"""Rules kept outside the package, end to end from a folder outside the repository
(stare_lab.methods.outside; the project layout: tests/support/outside_rule_fixtures.py).

Each of the three ways (a sweep's `imports:`, `--import MODULE`, the `stare_lab.rules` entry point)
registers its rule in the driver, the local workers and the Slurm workers; a module that can not be
imported is one line, exit 2, nothing created and torch not imported; each run's record names the
modules with their file and sha256; `status`, `table`, `plot` and `view` work from the records with
every module gone; an edited rule file makes only its own runs "other code".
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from outside_rule_fixtures import RULES, env, make_project, sha256, stare_lab, write_sweep
from sweep_fixtures import SLURM_LAUNCHER, TINY, slurm_cluster  # noqa: F401

from stare_lab.record import code_version

OUTSIDE = ["above_median_entropy", "below_median_entropy", "high_surprisal"]
NOT_FOUND = "unknown method option '{}'; valid: "


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("outside"))


def one_line(proc) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(err.splitlines()) == 1 and err.startswith("stare-lab: error: "), err
    return err


@pytest.mark.parametrize(
    "rule, args, pythonpath",
    [
        ("above_median_entropy", (), ()),  # the sweep's imports: [above_median], found beside the sweep file
        ("below_median_entropy", ("--import", "cli_rules"), ()),  # found in the current folder
        ("high_surprisal", (), ("site",)),  # an installed package's entry point, never named
    ],
)
def test_each_way_registers_its_rule_and_without_it_the_name_is_refused(project, rule, args, pythonpath):
    imports = ["above_median"] if rule == "above_median_entropy" else None
    write_sweep(project, f"dry_{rule}", ["full", rule], imports=imports)
    path = f"sweeps/dry_{rule}.yaml"
    folders = tuple(project / p for p in pythonpath)
    ok = stare_lab(project, "sweep", "run", path, "--dry-run", *args, pythonpath=folders)
    assert ok.returncode == 0, ok.stderr
    assert re.search(rf"│ 1 │ \w{{12}} │ {rule} seed=0 +│ {rule} ", ok.stdout), ok.stdout
    if rule != "high_surprisal":
        module = RULES[rule][0]
        assert f"rules imported from {module} (" in ok.stdout
    write_sweep(project, f"dry_{rule}", ["full", rule])  # no imports:, no --import, no package
    bad = stare_lab(project, "sweep", "run", path, "--dry-run")
    err = one_line(bad)
    assert NOT_FOUND.format(rule) in err and "--import MODULE" in err and "stare_lab.rules" in err
    assert not (project / "work" / "runs" / f"dry_{rule}").exists()


def test_a_module_that_can_not_be_imported_is_one_line_exit_2_before_anything(project):
    work = project / "work"
    (work / "sweeps" / "broken_rule.py").write_text("import torch\n\nVALUE = 1\nraise RuntimeError('boom at import')\n")
    cases = {
        "nope": "imports: cannot import rule module 'nope' (searched {folder}, then sys.path (PYTHONPATH)): "
        "ModuleNotFoundError: No module named 'nope'",
        "broken_rule": "imports: cannot import rule module 'broken_rule' (searched {folder}, then sys.path "
        "(PYTHONPATH)): RuntimeError: boom at import ({folder}/broken_rule.py, line 4)",
        "my-rules.py": "imports[0]: 'my-rules.py' is a file name; write the module name ('my-rules' for my-rules.py)",
    }
    for module, expected in cases.items():
        path = write_sweep(project, "unimportable", ["full"], imports=[module])
        err = one_line(stare_lab(project, "sweep", "run", str(path)))
        assert err == f"stare-lab: error: {path}: " + expected.format(folder=work / "sweeps"), err
        assert not (work / "runs" / "unimportable").exists()
    for args in (["sweep", "run", "sweeps/dry_full.yaml"], ["train", "method=full"], ["eval", "."]):
        write_sweep(project, "dry_full", ["full"])
        (work / "config.yaml").write_text("run: {}\n")  # `eval .`: a run directory, as far as the option goes
        err = one_line(stare_lab(project, *args, "--import", "nope"))
        assert f"--import: cannot import rule module 'nope' (searched {work}, then sys.path (PYTHONPATH))" in err
        (work / "config.yaml").unlink()
    assert not (work / "runs").exists()


def test_refusals_import_torch_only_through_a_module_of_the_user(project):
    """A refused import and an unknown rule exit before torch's import; a bad parameter of an imported
    rule is refused after that module's own top-level `import torch` (these modules have one, as the
    README's rule does; docs/rules_outside.md says how to keep such a refusal fast)."""
    write_sweep(project, "unknown_rule", ["below_median_entropy"])
    write_sweep(project, "bad_param", ["above_median_entropy"], imports=["above_median"])
    sweep = yaml.safe_load((project / "work" / "sweeps" / "bad_param.yaml").read_text())
    sweep["base"]["overrides"]["method.params.normalize"] = 5
    (project / "work" / "sweeps" / "bad_param.yaml").write_text(yaml.safe_dump(sweep))
    code = (
        "import sys\nfrom stare_lab.cli import main\n"
        "rc = main(sys.argv[1:])\nprint(f'rc={rc} torch={\"torch\" in sys.modules}')\n"
    )
    for args, needle, torch in [
        (["sweep", "run", "sweeps/bad_param.yaml", "--dry-run", "--import", "nope"], "No module named 'nope'", False),
        (["sweep", "run", "sweeps/unknown_rule.yaml", "--dry-run"], "unknown method option", False),
        (
            ["sweep", "run", "sweeps/bad_param.yaml", "--dry-run"],
            "base.overrides.method.params.normalize: rule 'above_median_entropy': parameter 'normalize' "
            "(method.params.normalize) expects a string, got 5 (an integer)",
            True,
        ),
        (
            ["train", "--import", "cli_rules", "method=below_median_entropy", "method.params.normalize=1.5"],
            "got 1.5",
            True,
        ),
    ]:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args], cwd=project / "work", env=env(), capture_output=True, text=True
        )
        assert proc.stdout.strip() == f"rc=2 torch={torch}", (args, proc.stdout, proc.stderr)
        assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_broken_entry_point_is_one_line_for_running_and_no_matter_for_reading(project):
    write_sweep(project, "dry_full", ["full"])
    bad = stare_lab(project, "sweep", "run", "sweeps/dry_full.yaml", "--dry-run", pythonpath=(project / "broken_site",))
    err = one_line(bad)
    assert (
        "entry point 'gone' = 'broken_rules_missing' of group stare_lab.rules (package broken-rules 0.2): "
        "cannot import it: ModuleNotFoundError: No module named 'broken_rules_missing'"
    ) in err
    status = stare_lab(project, "sweep", "status", "sweeps/dry_full.yaml", pythonpath=(project / "broken_site",))
    assert status.returncode == 0 and "not started" in status.stdout, status.stderr


def _record(run_dir) -> tuple[dict, dict]:
    return yaml.safe_load((run_dir / "config.yaml").read_text()), json.loads((run_dir / "status.json").read_text())


def _check_records(project, name: str, methods: list[str]) -> dict[str, str]:
    """Every run finished, its config carrying run.imports and its record the modules with their hashes;
    returns {method: run id}."""
    work, site = project / "work", project / "site"
    files = {
        "above_median": work / "sweeps" / "above_median.py",
        "cli_rules": work / "cli_rules.py",
        "ep_rules": site / "ep_rules.py",
    }
    ids = {}
    for run_dir in sorted((work / "runs" / name).glob("*/config.yaml")):
        cfg, status = _record(run_dir.parent)
        method = cfg["method"]["name"]
        ids[method] = cfg["run"]["id"]
        assert status["state"] == "finished" and status["error"] is None, (method, status.get("error"))
        assert cfg["run"]["imports"] == [
            {"module": "cli_rules", "path": str(work)},
            {"module": "above_median", "path": str(work / "sweeps")},
        ]
        modules = {m["module"]: m for m in status["provenance"][-1]["rule_modules"]}
        origin = RULES[method][0] if method in RULES else None
        assert set(modules) == {"cli_rules", "above_median"} | ({origin} if origin else set()), modules
        for module, record in modules.items():
            assert record["file"] == str(files[module]) and record["sha256"] == sha256(files[module])
            assert record["defines_rule"] == (module == origin)
        rows = [json.loads(line) for line in (run_dir.parent / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]
        if method in RULES:  # strictly above (below) the median of the batch: at most half, some
            assert all(0 < r["tokens/selected_frac"] <= 0.5 for r in rows), [r["tokens/selected_frac"] for r in rows]
    assert sorted(ids) == sorted(methods)
    return ids


def test_local_sweep_of_all_three_ways_then_reading_commands_without_any_of_them(project):
    work = project / "work"
    methods = ["full", *OUTSIDE]
    path = write_sweep(
        project,
        "local3",
        methods,
        imports=["above_median"],
        base=_base({"trainer.keep_batches_every": 1}),
        launcher={"name": "local", "workers": 2},
    )
    run = stare_lab(
        project, "sweep", "run", str(path.relative_to(work)), "--import", "cli_rules", pythonpath=(project / "site",)
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "done: 4 finished" in run.stdout
    ids = _check_records(project, "local3", methods)

    hidden = project / "hidden"
    hidden.mkdir(exist_ok=True)
    for f in (work / "sweeps" / "above_median.py", work / "cli_rules.py"):
        shutil.move(f, hidden / f.name)
    try:  # and no PYTHONPATH: no module of the three can be imported
        status = stare_lab(project, "sweep", "status", "sweeps/local3.yaml")
        assert status.returncode == 0 and "4 runs — 4 finished" in status.stdout, status.stdout + status.stderr
        for method, run_id in ids.items():
            assert re.search(rf"{method} seed=0 +{run_id}", status.stdout), status.stdout
        table = stare_lab(project, "table", "sweeps/local3.yaml")
        assert table.returncode == 0, table.stderr
        results = table.stdout.split("Seeds per arm")[0]  # the results table, not the seeds-needed one
        arms = re.findall(r"^\| (\w+) \| 1 \|", results, re.M)
        assert sorted(arms) == sorted(methods) and "not in the current plan" not in table.stderr, table.stdout
        plot = stare_lab(project, "plot", "sweeps/local3.yaml")
        assert plot.returncode == 0 and "training curves:" in plot.stdout, plot.stderr
        _reading_a_changed_plan(project, ids)
        view = stare_lab(project, "view", "sweeps/local3.yaml")
        assert view.returncode == 0, view.stderr
        page = (work / "runs" / "local3").glob("view-step-*.html")
        html = next(page).read_text()
        assert all(f"{method} seed=0" in html for method in methods)
    finally:
        for f in hidden.iterdir():
            shutil.move(f, (work / "sweeps" if f.name == "above_median.py" else work) / f.name)

    # A finished run's code is the project's commit and, for a rule kept outside, its module's hash;
    # another helper's commit meanwhile makes every run "other code", so the note is read against
    # the version the runs recorded.
    own = code_version({**_record(work / "runs" / "local3" / ids["full"])[1], "rule_modules": []})
    old = sha256(work / "cli_rules.py")[:10]
    again = _sweep_again(project)
    assert "0 to run (none); 4 finished (skipped)" in again
    assert "other code" not in again or f"other code than {own} (" not in again, again
    rule_file = work / "cli_rules.py"
    rule_file.write_text(rule_file.read_text() + "\n# edited\n")
    note = re.search(r"came from other code than (\S+) \((.*)\); --rerun", _sweep_again(project))
    assert note is not None and f"{own} cli_rules@{old}: 1" in note.group(2), note
    if note.group(1) == own:  # the checkout did not move: only the edited module's run is other code
        assert note.group(2) == f"{own} cli_rules@{old}: 1", note.group(2)


def _reading_a_changed_plan(project, ids: dict[str, str]) -> None:
    """With the modules gone: a second seed is 4 runs not started beside the 4 finished (the outside
    rules' under a provisional id no folder has); another parameter matches no record, its 4 runs are
    not started and the 4 finished ones are not in the plan."""
    sweeps = project / "work" / "sweeps"
    sweep = yaml.safe_load((sweeps / "local3.yaml").read_text())
    (sweeps / "more.yaml").write_text(yaml.safe_dump({**sweep, "seeds": [0, 1]}))
    more = stare_lab(project, "sweep", "status", "sweeps/more.yaml")
    assert more.returncode == 0 and "8 runs — 4 finished, 4 not started" in more.stdout, more.stdout + more.stderr
    assert all(re.search(rf"{m} seed=0 +{i} ", more.stdout) for m, i in ids.items()), more.stdout
    assert all(re.search(rf"{m} seed=1 +\w{{12}} ", more.stdout) for m in ids), more.stdout
    sweep["base"]["overrides"]["method.params.normalize"] = "valid"
    (sweeps / "edit.yaml").write_text(yaml.safe_dump(sweep))
    edit = stare_lab(project, "sweep", "status", "sweeps/edit.yaml")
    assert edit.returncode == 0 and "8 runs — 4 finished, 4 not started" in edit.stdout, edit.stdout + edit.stderr
    assert "4 run(s) not in the current plan" in edit.stdout and all(i in edit.stdout for i in ids.values())


def _sweep_again(project) -> str:
    args = ("sweep", "run", "sweeps/local3.yaml", "--import", "cli_rules")
    proc = stare_lab(project, *args, pythonpath=(project / "site",))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def _base(extra: dict) -> dict:
    return {"model": "builtin", "logger": "none", "overrides": {**TINY, **extra}}


def test_train_and_eval_of_a_rule_given_by_import(project):
    work = project / "work"
    run_dir = work / "runs" / "train_cli"
    overrides = [f"{k}={v}" for k, v in TINY.items()] + ["logger=none", "eval.n=2", f"run_dir={run_dir}"]
    train = stare_lab(project, "train", "--import", "cli_rules", "method=below_median_entropy", *overrides)
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-3000:]
    cfg, status = _record(run_dir)
    assert cfg["run"]["imports"] == [{"module": "cli_rules", "path": str(work)}]
    (record,) = status["provenance"][-1]["rule_modules"]
    assert record == {
        "module": "cli_rules",
        "file": str(work / "cli_rules.py"),
        "sha256": sha256(work / "cli_rules.py"),
        "defines_rule": True,
    }
    # eval imports the run's own run.imports: no --import needed
    ev = stare_lab(project, "eval", str(run_dir), "--n", "3", "--benchmarks", "arithmetic")
    assert ev.returncode == 0 and re.search(r"^arithmetic: .*\(n=3,", ev.stdout, re.M), ev.stdout + ev.stderr[-2000:]


SLURM = SLURM_LAUNCHER


@pytest.mark.slurm
def test_slurm_workers_see_all_three_ways(project, slurm_cluster):  # noqa: F811
    path = write_sweep(project, "slurm3", OUTSIDE, imports=["above_median"], launcher=SLURM, eval=False)
    run = stare_lab(
        project,
        "sweep",
        "run",
        str(path.relative_to(project / "work")),
        "--import",
        "cli_rules",
        pythonpath=(project / "site",),
        SLURM_CONF=str(slurm_cluster),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _check_records(project, "slurm3", OUTSIDE)
    for run_dir in (project / "work" / "runs" / "slurm3").glob("*/status.json"):
        assert re.fullmatch(r"\d+_[0-2]", json.loads(run_dir.read_text())["slurm_job_id"])
