"""W&B export, read back from the offline run files with W&B's own reader (`wandb leet inspect --json`):
a run's summary holds exactly its eval/ record (final results, bootstrap interval, settings) with
every evaluation as a point; the token page, its figures and what the page shows are in the run;
the sweep summary run holds the finished table and the pass@k curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic_batch import write_random_batch
from wandb_files import final_summary, history, media, run_records

from stare_lab.config.run_config import compose, save_config
from stare_lab.viewer import plot_selection, render_run
from stare_lab.viewer.wandb_export import log_eval, log_sweep_summary, log_token_page, summary_run_id


def _run_dir(tmp_path: Path, method: str, seed: int, sweep: str = "wb_view") -> tuple[Path, str]:
    cfg = compose([f"method={method}", f"seed={seed}", "logger=wandb_offline", f"run.sweep={sweep}"])
    d = tmp_path / "runs" / sweep / cfg.run.id
    save_config(cfg, d / "config.yaml")
    return d, cfg.run.id


def _eval_json(d: Path, step: int | None, avg: float, intermediate: bool = False) -> dict:
    result = {
        "benchmark": "arithmetic",
        "step": step,
        "n": 4,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 16,
        "verifier": "exact",
        "num_problems": 8,
        "metrics": {
            "avg@4": avg,
            "avg@4_ci": [avg - 0.125, avg + 0.125],
            "pass@1": avg,
            "pass@2": min(1.0, avg + 0.125),
            "pass@4": min(1.0, avg + 0.25),
            "maj@4": avg,
        },
    }
    dest = d / "eval" / (f"step-{step}" if intermediate else "")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "arithmetic.json").write_text(json.dumps(result))
    return result


def test_run_summary_holds_its_eval_record_and_every_evaluation_as_a_point(tmp_path):
    d, run_id = _run_dir(tmp_path, "stare", 0)
    _eval_json(d, 2, 0.25, intermediate=True)
    _eval_json(d, 4, 0.3125, intermediate=True)
    final = _eval_json(d, 6, 0.375)
    written = log_eval(d)
    records = run_records(d / "wandb", run_id)
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["run_id"] == run_id and run["run_group"] == "wb_view"
    summary = final_summary(records)
    for metric in ("avg@4", "pass@1", "pass@2", "pass@4", "maj@4"):
        assert summary[f"eval/arithmetic/{metric}"] == final["metrics"][metric]
    assert [summary["eval/arithmetic/avg@4_ci_lo"], summary["eval/arithmetic/avg@4_ci_hi"]] == final["metrics"][
        "avg@4_ci"
    ]
    assert summary["eval/arithmetic/settings"] == {
        "n": 4,
        "temperature": 1,
        "top_p": 1,
        "max_tokens": 16,
        "verifier": "exact",
        "engine": "transformers",  # a result written before results named their engine was a transformers one
        "num_problems": 8,
        "step": 6,
    }
    assert {k: v for k, v in written.items() if not k.endswith("settings")} == {
        k: summary[k] for k in written if not k.endswith("settings")
    }
    points = {h["eval/step"]: h["eval/arithmetic/avg@4"] for h in history(records) if "eval/step" in h}
    assert points == {2: 0.25, 4: 0.3125, 6: 0.375}


def test_token_page_and_figures_go_into_the_run_record(tmp_path):
    d, run_id = _run_dir(tmp_path, "stare", 1)
    for step in (0, 3):
        write_random_batch(d, step, B=8, T=12, run_rule={"name": "stare", "params": {"H_tgt": 10.0}})
    page = render_run(d)
    figures = plot_selection(d, d / "figures")
    shown = log_token_page(d, page, figures)
    records = run_records(d / "wandb", run_id)
    summary = final_summary(records)
    data = json.loads(page.read_text().split('<script id="data" type="application/json">')[1].split("</script>")[0])
    arm = data["arms"][0]
    for r in arm["rules"]:
        for key in ("selected_frac", "trained_frac", "touched_frac"):
            assert summary[f"tokens/{key}/{r['key']}"] == pytest.approx(r[key], rel=1e-12)
    assert summary["tokens/step"] == 3 and len(shown) == 1 + 3 * len(arm["rules"])
    item = next(h for h in history(records) if media(h, "tokens/page"))
    folder = Path(item["folder"]) / "files"
    assert media(item, "tokens/page")["_type"] == "html-file"
    assert (folder / media(item, "tokens/page")["path"]).read_text() == page.read_text()
    assert len(figures) == 2
    for fig in figures:
        entry = media(item, f"tokens/{fig.stem}")
        assert entry["_type"] == "image-file" and (folder / entry["path"]).read_bytes() == fig.read_bytes()
    table = json.loads((folder / media(item, "tokens/overlap")["path"]).read_text())
    assert table["columns"] == ["rule", *arm["overlap"]["keys"]]
    assert [row[1:] for row in table["data"]] == arm["overlap"]["matrix"]  # JSON floats round-trip exactly


def test_sweep_summary_run_holds_the_finished_table_and_passk_curves(tmp_path):
    from stare_lab.analysis.tables import passk_table, results_table
    from stare_lab.record.frames import collect_runs

    avgs = {("full", 0): 0.25, ("full", 1): 0.375, ("stare", 0): 0.5, ("stare", 1): 0.625}
    for (method, seed), avg in avgs.items():
        d, _ = _run_dir(tmp_path, method, seed, sweep="wb_sweep")
        _eval_json(d, 6, avg)
    df = collect_runs(tmp_path / "runs" / "wb_sweep")
    table = results_table(df)
    passk = {"arithmetic": passk_table(df, "arithmetic")}
    out = tmp_path / "runs" / "wb_sweep"
    summary = log_sweep_summary("wb_sweep", table, passk, out_dir=out, mode="offline")
    records = run_records(out / "wandb", summary_run_id("wb_sweep"))
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["run_group"] == "wb_sweep" and run["job_type"] == "summary"
    got = final_summary(records)
    means = table.pivot("mean")
    assert got["table/full/arithmetic"] == pytest.approx(means.loc["full", "arithmetic"]) == pytest.approx(0.3125)
    assert got["table/stare/arithmetic"] == pytest.approx(0.5625)
    pk = passk["arithmetic"].pivot("mean")
    for rule in ("full", "stare"):
        for k in (1, 2, 4):
            assert got[f"passk/arithmetic/{rule}/pass@{k}"] == pytest.approx(pk.loc[rule, k])
    assert {k: v for k, v in summary.items()} == {k: got[k] for k in summary}
    item = next(h for h in history(records) if media(h, "table"))
    folder = Path(item["folder"]) / "files"
    logged = json.loads((folder / media(item, "table")["path"]).read_text())
    markdown = table.to_markdown()
    assert [row[0] for row in logged["data"]] == table.rules
    for row in logged["data"]:
        assert row[1].split(" ± ")[0] in markdown  # the same numbers as the printed table
    curve = media(item, "passk/arithmetic_table")
    curve = json.loads((folder / curve["path"]).read_text())
    got_curve = {(row[1], int(row[0])): row[2] for row in curve["data"]}  # line_series rows: (x, key, y)
    assert got_curve == {(r, k): pytest.approx(pk.loc[r, k]) for r in ("full", "stare") for k in (1, 2, 4)}


def test_stare_lab_table_wandb_writes_the_sweep_summary_run(tmp_path, capsys):
    from stare_lab.cli import main

    for (method, seed), avg in {("full", 0): 0.25, ("stare", 0): 0.75}.items():
        d, _ = _run_dir(tmp_path, method, seed, sweep="wb_cli")
        _eval_json(d, 6, avg)
    root = tmp_path / "runs" / "wb_cli"
    assert main(["table", str(root), "--wandb"]) == 0
    got = final_summary(run_records(root / "wandb", summary_run_id("wb_cli")))
    assert got["table/full/arithmetic"] == pytest.approx(0.25)
    assert got["table/stare/arithmetic"] == pytest.approx(0.75)
    from stare_lab.analysis.tables import passk_table
    from stare_lab.record.frames import collect_runs

    pk = passk_table(collect_runs(root), "arithmetic").pivot("mean")
    assert got["passk/arithmetic/stare/pass@1"] == pytest.approx(pk.loc["stare", 1])


def test_sweep_summary_run_holds_the_differences_and_their_intervals(tmp_path):
    """The summary run gets compare_arms' numbers: the same differences and intervals as the printed table."""
    import fixtures_runs as fx

    from stare_lab.analysis import collect_problems, collect_runs, results_table

    root = fx.write_sweep(tmp_path / "runs")
    table = results_table(collect_runs(root), per_problem=collect_problems(root))
    summary = log_sweep_summary("wb_compare", table, out_dir=root, mode="offline")
    got = final_summary(run_records(root / "wandb", summary_run_id("wb_compare")))
    cmp = table.comparison
    assert cmp is not None and len(cmp) == 6  # 2 arms × (2 benchmarks + Avg.)
    for r in cmp.to_dict("records"):
        key = f"compare/{r['arm']}/{r['benchmark']}"
        for field in ("delta", "ci_lo", "ci_hi", "p_value", "p_holm"):
            assert got[f"{key}/{field}"] == pytest.approx(r[field]) == pytest.approx(summary[f"{key}/{field}"])
        assert got[f"{key}/verdict"] == r["verdict"] == "n.s."
    md = table.to_markdown()
    stare = cmp.set_index(["arm", "benchmark"]).loc[("stare", "arithmetic")]
    assert f"(+4.0 [{stare['ci_lo']:+.1f}, {stare['ci_hi']:+.1f}])" in md  # the printed interval
