"""The sweep's W&B dashboard, built with W&B's own `wandb-workspaces` library for a real sweep
(2 rules × 1 seed on the built-in model, W&B offline, token pages kept) and its summary run as
`stare-lab table --wandb` writes it (with the forest plot): every panel is on a key the runs
logged, as W&B's own reader (`wandb leet inspect`) reads their files back; each `rule/...` key is
in the sections of exactly the rules that log it; every logged training metric has a panel; the
grouping keys are in the runs' W&B configs; the specification is the library's JSON and reads
back; without a key the command writes it and says how to publish it; with a key the real
library saves it (to a W&B GraphQL stand-in on 127.0.0.1: no network here) and saving again
updates the same view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
import yaml
from sweep_fixtures import TINY, sweep_run
from wandb_files import wandb_records
from wandb_workspaces.workspaces import internal

from stare_lab.dashboard.build import SPEC_FILE, build_dashboard, load_workspace, main
from stare_lab.dashboard.logged import LoggedRun
from stare_lab.dashboard.view import grouping_keys

ROOT = Path(__file__).resolve().parents[2]
RULES = ("full", "stare")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """The sweep file of a finished real sweep with its summary run; its folder is <tmp>/runs/dash."""
    tmp = tmp_path_factory.mktemp("dashboard")
    spec = {
        "name": "dash",
        "base": {
            "model": "builtin",
            "logger": "wandb_offline",
            "overrides": {**TINY, "trainer.keep_batches_every": 1},
        },
        "grid": {"method": list(RULES)},
        "seeds": [0],
        "eval": {"benchmarks": ["arithmetic"], "n": 2},
        "launcher": {"name": "local", "workers": 1},
        "output": str(tmp / "runs"),
    }
    file = tmp / "dash.yaml"
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    env.update(WANDB_MODE="offline", OMP_NUM_THREADS="1")
    out = sweep_run(file, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    _log_summary_run(tmp / "runs" / "dash")
    return file


def _log_summary_run(root: Path) -> None:
    """What `stare-lab table --wandb` logs, with the forest plot among its figures."""
    from stare_lab.analysis import collect_problems, collect_runs, passk_table, plot_forest, plot_passk, results_table
    from stare_lab.viewer.wandb_export import log_sweep_summary

    df = collect_runs(root)
    table = results_table(df, baseline="full", per_problem=collect_problems(root))
    assert table.comparison is not None and not table.comparison.empty
    figures = plot_passk(df, root / "figures", baseline="full")
    figures += plot_forest(
        table.comparison, root / "figures", baseline="full", metric=table.metric, confidence=table.confidence
    )
    passk = {"arithmetic": passk_table(df, "arithmetic", baseline="full")}
    log_sweep_summary("dash", table, passk, figures, out_dir=root, mode="offline")


class Logged:
    """One W&B run as the test reads it: W&B's reader over every transaction log of the run."""

    def __init__(self, logs: list[Path]):
        records = [r for log in logs for r in wandb_records(log)]
        run = next(r["run"] for r in records if r["type"] == "run")
        self.config = (run.get("config") or {}).get("update") or {}
        self.job_type, self.group = run.get("job_type"), run.get("run_group")
        items = [r["history"]["item"] for r in records if r["type"] == "history"]
        self.history = {k for i in items for k, v in i.items() if _number(v) and not k.startswith("_") and "." not in k}
        self.media = {k[: -len("._type")]: v for i in items for k, v in i.items() if k.endswith("._type")}
        self.summary = {
            k
            for r in records
            if r["type"] == "summary"
            for k, v in (r["summary"].get("update") or {}).items()
            if _number(v)
        }
        configs = [r["config"]["update"] for r in records if r["type"] == "config"]
        self.charts = {
            k.split(".", 2)[2]: v for c in configs for k, v in c.items() if k.startswith("_wandb.visualize.")
        }

    @property
    def rule(self) -> str | None:
        return (self.config.get("method") or {}).get("name")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _logged(root: Path) -> list[Logged]:
    logs = sorted(root.glob("*/wandb/*/run-*.wandb")) + sorted(root.glob("wandb/*/run-*.wandb"))
    by_run: dict[str, list[Path]] = {}
    for log in logs:
        by_run.setdefault(log.name, []).append(log)
    return [Logged(v) for v in by_run.values()]


def _name(metric) -> str:
    return getattr(metric, "name", metric)


def _panel_keys(panel) -> tuple[str, list[str]]:
    """(what the panel reads, its keys), from the library's own panel classes."""
    if isinstance(panel, wr.LinePlot):
        return "history", [_name(y) for y in panel.y] + ([] if _name(panel.x) == "Step" else [_name(panel.x)])
    if isinstance(panel, wr.BarPlot):
        return "summary", [_name(m) for m in panel.metrics]
    if isinstance(panel, wr.MediaBrowser):
        return "media", list(panel.media_keys)
    if isinstance(panel, wr.WeavePanelSummaryTable):
        return "table", [panel.table_name]
    if isinstance(panel, wr.CustomChart):
        return "chart", [panel.query["summaryTable"]["tableKey"]]
    raise AssertionError(f"a panel the test does not know: {panel!r}")


def _logs_key(run: Logged, kind: str, key: str) -> bool:
    if kind == "history":
        return key in run.history
    if kind == "summary":
        return key in run.summary
    if kind == "media":
        return key in run.media
    if kind == "table":
        return run.media.get(key) == "table-file"
    tables = [json.dumps(c) for c in run.charts.values()]
    return run.media.get(key) == "table-file" and any(f'"tableKey", "value": "{key}"' in t for t in tables)


@pytest.fixture(scope="module")
def built(sweep):
    root = sweep.parent / "runs" / "dash"
    d = build_dashboard(sweep, publish=False)
    return d, load_workspace(root / SPEC_FILE), _logged(root)


def test_every_panel_is_on_a_key_the_runs_logged(built):
    d, workspace, runs = built
    training = [r for r in runs if r.job_type != "summary"]
    assert sorted(r.rule for r in training) == sorted(RULES) and len(runs) == 3
    seen: dict[str, set[str]] = {}
    for section in workspace.sections:
        for panel in section.panels:
            kind, keys = _panel_keys(panel)
            assert keys, f"{section.name}: a panel without keys"
            # a rule's section: the keys of that rule's runs; everywhere else: any run's
            owners = (
                [r for r in runs if r.rule == section.name[len("Rule: ") :]]
                if section.name.startswith("Rule: ")
                else runs
            )
            for key in keys:
                assert any(_logs_key(r, kind, key) for r in owners), f"{section.name}: {kind} key {key!r} nobody logged"
                seen.setdefault(kind, set()).add(key)
    names = [s.name for s in workspace.sections]
    for expected in ("reward", "accuracy", "entropy", "tokens/entropy_selected", "tokens/selected_frac"):
        assert expected in seen["history"]
    assert {"clip_ratio/low_mean", "clip_ratio/high_mean", "completions/mean_length"} <= seen["history"]
    assert {"eval/arithmetic/avg@2", "eval/arithmetic/pass@1", "eval/arithmetic/pass@2"} <= seen["summary"]
    assert {"tokens/page", "figures/forest_arithmetic"} <= seen["media"]
    assert {"comparison", "table", "tokens/overlap"} <= seen["table"] and seen["chart"] == {"passk/arithmetic_table"}
    assert "Rule: stare" in names and "Rule: full" not in names  # full logs no rule/ key
    assert d.runs == 2 and d.summary_run


def test_each_rule_key_is_in_the_sections_of_exactly_the_rules_that_log_it(built):
    _, workspace, runs = built
    logged_by: dict[str, set[str]] = {}
    for r in runs:
        for key in r.history:
            if key.startswith("rule/"):
                logged_by.setdefault(key, set()).add(str(r.rule))
    shown_in: dict[str, set[str]] = {}
    for section in workspace.sections:
        for panel in section.panels:
            for key in _panel_keys(panel)[1]:
                if key.startswith("rule/"):
                    assert section.name.startswith("Rule: "), f"{key} outside a rule's section"
                    shown_in.setdefault(key, set()).add(section.name[len("Rule: ") :])
    assert logged_by and {"rule/gate", "rule/W", "rule/M"} <= set(logged_by)  # stare's (methods/stare.py)
    assert shown_in == logged_by


def test_every_logged_training_metric_has_a_panel(built):
    _, workspace, runs = built
    shown = {k for s in workspace.sections for p in s.panels for k in _panel_keys(p)[1]}
    logged = {k for r in runs for k in r.history if not k.startswith("eval/") and k != "tokens/step"}
    assert logged - shown == set()
    final_eval = {k for r in runs if r.job_type != "summary" for k in r.summary if k.startswith("eval/")}
    assert {k for k in final_eval if not k.endswith(("_ci_lo", "_ci_hi")) and k != "eval/step"} <= shown


def test_runs_are_grouped_by_config_keys_the_runs_have(built):
    d, workspace, runs = built
    training = [r for r in runs if r.job_type != "summary"]
    groupby = workspace.runset_settings.groupby
    assert [type(g) for g in groupby] == [ws.Config] and [g.name for g in groupby] == ["method.name"]
    spec = json.loads(d.path.read_text())
    (runset,) = spec["spec"]["section"]["runSets"]
    assert runset["grouping"] == [{"section": "config", "name": "method.value.name"}]  # W&B's nested config key
    for r in training:
        value = r.config
        for part in "method.name".split("."):
            assert isinstance(value, dict) and part in value, f"run config lacks method.name: {r.config}"
            value = value[part]
        assert value == r.rule
    assert len({r.rule for r in training}) == len(RULES)  # one group per rule
    assert workspace.runset_settings.filters == ws.RunsetSettings(filters=[ws.Metric("Group") == "dash"]).filters
    assert {r.group for r in runs} == {"dash"}
    for section in workspace.sections:
        for panel in section.panels:
            if isinstance(panel, (wr.LinePlot, wr.BarPlot)):  # seeds: the mean with its min-max band
                assert (panel.groupby_aggfunc, panel.groupby_rangefunc) == ("mean", "minmax")


def test_the_specification_is_the_librarys_json_and_building_again_gives_the_same(built, sweep, tmp_path):
    d, workspace, _ = built
    text = d.path.read_text()
    assert json.loads(text) == d.workspace._spec
    view = internal.View.model_validate_json(text)
    assert view.project == "stare_lab" and view.display_name == "dash (stare-lab)" and view.name == ""
    assert ws.Workspace._from_model(view)._spec == d.workspace._spec  # reads back to the same view
    build_dashboard(sweep, publish=False, out=tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == text  # panel ids come from their content


def test_without_a_key_the_command_writes_the_spec_and_says_how_to_publish_it(sweep, tmp_path, capsys):
    out = tmp_path / "view.json"
    assert main([str(sweep), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0]
    assert lines[0].endswith(f"to publish it: WANDB_API_KEY=... stare-lab dashboard {sweep}")
    assert json.loads(out.read_text())["displayName"] == "dash (stare-lab)"


def test_after_a_sweep_without_a_key_nothing_is_published(sweep):
    from stare_lab.dashboard import publish_after_sweep

    assert os.environ.get("WANDB_MODE") == "offline" and "WANDB_API_KEY" not in os.environ  # conftest.py
    assert publish_after_sweep(sweep.parent / "runs" / "dash") is None


def test_user_mistakes_are_one_line_and_exit_2(sweep, tmp_path, capsys):
    assert main([str(tmp_path / "nope.yaml")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"stare-lab: error: no such sweep file or run folder: {tmp_path / 'nope.yaml'}"
    )
    empty = tmp_path / "empty"
    (empty / "r1").mkdir(parents=True)
    (empty / "r1" / "config.yaml").write_text("seed: 0\n")
    assert main([str(empty)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has W&B files" in err[0] and not (empty / SPEC_FILE).exists()
    assert main([str(sweep), "--colour", "red"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_grouping_keys_split_arms_as_the_analysis_does():
    def run(method, seed, lr, variant=None, sub="a"):
        cfg = {"method": {"name": method}, "seed": seed, "trainer": {"learning_rate": lr, "output_dir": f"/x/{sub}"}}
        cfg["run"] = {"id": f"{method}{seed}{lr}", "variant": variant}
        return LoggedRun(run_id=cfg["run"]["id"], files=[], config=cfg)

    # seeds, run ids and paths differ within an arm without splitting it
    assert grouping_keys([run("full", 0, 1e-6), run("full", 1, 1e-6, sub="b")]) == ["method.name"]
    # a learning-rate grid without variants: the rule's runs differ in trainer.learning_rate
    lr_grid = [run("stare", s, lr) for s in (0, 1) for lr in (1e-6, 3e-6)] + [run("full", 0, 1e-6)]
    assert grouping_keys(lr_grid) == ["method.name", "trainer.learning_rate"]
    # variants name their arms; runs of one variant agree on everything else
    bands = [run("rsi_band", 0, 1e-6, "low"), run("rsi_band", 0, 1e-6, "high")]
    assert grouping_keys(bands) == ["method.name", "run.variant"]


class _StandIn(BaseHTTPRequestHandler):
    """W&B's GraphQL endpoint for the two queries saving a view makes: the viewer and upsertView."""

    views: list[dict] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        query = body.get("query", "")
        data: dict = {}
        if "upsertView" in query:
            self.views.append(body["variables"])
            data = {"upsertView": {"view": {"id": "VmlldzoxMjM0", "name": "nw-dash0view1-v"}, "inserted": True}}
        elif "viewer" in query:
            data = {"viewer": {"id": "1", "entity": "lab", "username": "lab", "teams": {"edges": []}}}
        out = json.dumps({"data": data}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_with_a_key_the_library_saves_the_view_and_saving_again_updates_it(sweep, tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_ENTITY")}
    env.update(WANDB_API_KEY="k" * 40, WANDB_BASE_URL=f"http://127.0.0.1:{server.server_port}")
    out = tmp_path / "view.json"
    folder = sweep.parent / "runs" / "dash"  # the run folder: no sweep file to compose in each process
    code = f"import sys; from stare_lab.dashboard import main; sys.exit(main([{str(folder)!r}, '--out', {str(out)!r}]))"
    after_sweep = (
        f"from stare_lab.dashboard import publish_after_sweep; print(repr(publish_after_sweep({str(folder)!r})))"
    )
    try:
        first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        third = subprocess.run(
            [sys.executable, "-c", after_sweep], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        server.shutdown()
    assert first.returncode == 0, first.stderr
    assert f"saved: http://127.0.0.1:{server.server_port}/lab/stare_lab?nw=dash0view1" in first.stdout
    assert second.returncode == 0, second.stderr
    url = f"http://127.0.0.1:{server.server_port}/lab/stare_lab?nw=dash0view1"
    assert third.returncode == 0 and third.stdout.strip().splitlines()[-1] == repr(
        f"W&B dashboard of sweep 'dash': {url}"
    )
    sent, again, after = _StandIn.views
    assert json.loads(after["spec"]) == json.loads(sent["spec"])  # the same view, from the sweep folder's file
    assert json.loads((folder / SPEC_FILE).read_text())["id"] == "VmlldzoxMjM0"
    assert (sent["entityName"], sent["projectName"], sent["displayName"]) == ("lab", "stare_lab", "dash (stare-lab)")
    spec = json.loads(out.read_text())
    assert json.loads(sent["spec"]) == json.loads(json.dumps(spec["spec"]))  # the spec written is the one sent
    assert "id" not in sent and again["id"] == "VmlldzoxMjM0" and again["name"] == "nw-dash0view1-v"
    assert (spec["entity"], spec["name"], spec["id"]) == ("lab", "nw-dash0view1-v", "VmlldzoxMjM0")


def test_the_command_line_runs_the_dashboard(sweep, tmp_path):
    """`stare-lab dashboard` on the command line: the spec written; a mistake is one line, exit 2."""
    exe = Path(sys.executable).with_name("stare-lab")
    out = tmp_path / "cli.json"
    ok = subprocess.run([str(exe), "dashboard", str(sweep), "--out", str(out)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(out.read_text())["displayName"] == "dash (stare-lab)"
    bad = subprocess.run([str(exe), "dashboard", str(tmp_path / "nope.yaml")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"stare-lab: error: no such sweep file or run folder: {tmp_path / 'nope.yaml'}"
    ]
