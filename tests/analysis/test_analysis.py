"""Analysis: run dirs → frames → tables and plots, against fixture runs with known numbers.

The expected numbers are worked out by hand in tests/support/fixtures_runs.py's docstring.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import fixtures_runs as fx
import numpy as np
import pandas as pd
import pytest

from stare_lab.analysis import (
    collect_problems,
    collect_runs,
    collect_training,
    passk_table,
    plot_passk,
    plot_training,
    results_table,
    run_states,
)
from stare_lab.record.frames import SettingsMismatch, rule_label

RSI = "rsi_band[0.5,1]"
# (rule, benchmark) → (mean, std, n_seeds, delta, best); fractions
EXPECTED = {
    ("full", "arithmetic"): (0.52, 0.02, 3, 0.0, False),
    ("full", "aime24"): (0.20, 0.10, 3, 0.0, False),
    ("full", "Avg."): (0.36, np.nan, 3, 0.0, False),
    ("stare", "arithmetic"): (0.56, 0.01, 3, 0.04, True),
    ("stare", "aime24"): (0.20, 0.05, 3, 0.0, False),
    ("stare", "Avg."): (0.38, np.nan, 3, 0.02, False),
    (RSI, "arithmetic"): (0.49, np.sqrt(2e-4), 2, -0.03, False),
    (RSI, "aime24"): (0.30, np.sqrt(5e-3), 2, 0.10, True),
    (RSI, "Avg."): (0.395, np.nan, 2, 0.035, True),
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    fx.write_sweep(root)
    return root


@pytest.fixture(scope="module")
def incomplete(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs_incomplete")
    fx.write_sweep(root, incomplete=True)
    return root


@pytest.fixture(scope="module")
def table(sweep):
    return results_table(collect_runs(sweep))


@pytest.fixture(scope="module")
def compared(sweep):
    """The same table with the runs' per-problem samples: every difference gets its interval."""
    return results_table(collect_runs(sweep), per_problem=collect_problems(sweep))


# ------------------------------------------------------------------------------------ collect


def test_rule_label():
    assert rule_label("full", None) == "full"
    assert rule_label("rsi_band", "[0.5,1]") == "rsi_band[0.5,1]"
    assert rule_label("rsi_band", "rsi_band[0.5,1]") == "rsi_band[0.5,1]"
    assert rule_label("rsi_band", "low") == "rsi_band[low]"


def test_collect_runs_reads_final_and_intermediate(sweep):
    df = collect_runs(sweep)
    for col in [
        "sweep",
        "run",
        "label",
        "rule",
        "seed",
        "step",
        "benchmark",
        "metric",
        "value",
        "cfg.method.params.low",
        "cfg.trainer.learning_rate",
    ]:
        assert col in df.columns, col
    assert set(df["arm"]) == {"full", "stare", RSI}
    assert set(df.loc[df["arm"] == RSI, "rule"]) == {"rsi_band"}
    final = df[df["final"] & (df["metric"] == "avg@32")]
    assert len(final) == len(fx.AVG) * 2
    assert set(final["step"]) == {fx.FINAL_STEP}
    row = final[(final["run"] == "stare-s2") & (final["benchmark"] == "aime24")].iloc[0]
    assert row["value"] == 0.20 and row["seed"] == 2 and row["sweep"] == "fx"
    assert row["temperature"] == 1.0 and row["verifier"] == "math_verify"
    inter = df[~df["final"] & (df["metric"] == "avg@32")]
    assert set(inter["step"]) == {30} and set(inter["value"]) == {0.99}
    ci = df[(df["run"] == "full-s1") & (df["benchmark"] == "arithmetic") & df["final"]]
    assert ci.set_index("metric").loc["avg@32_ci_lo", "value"] == pytest.approx(0.45)
    assert (df.loc[df["arm"] == RSI, "cfg.method.params.low"] == 0.5).all()


def test_collect_training_skips_truncated_line(incomplete):
    train = collect_training(incomplete)
    s3 = train[(train["run"] == "full-s3") & (train["metric"] == "reward")]
    assert list(s3["step"]) == list(fx.STEPS)  # the cut line (step 60) is gone
    assert s3["value"].iloc[-1] == pytest.approx(0.3 + 0.5 + 0.003)
    assert set(train.loc[train["arm"] == "stare", "metric"]) >= {"rule/gate", "reward", "entropy"}
    assert "time" not in set(train["metric"])


def test_run_states(incomplete):
    states = run_states(incomplete).set_index("run")
    assert len(states) == len(fx.AVG) + 1
    assert states.loc["ict-s1", "state"] == "failed"
    assert states.loc["rsi_band-b-s2", "arm"] == RSI
    assert states.loc["full-s1", "state"] == "finished" and states.loc["full-s1", "seed"] == 1


def test_empty_and_missing_files(tmp_path):
    assert collect_runs(tmp_path).empty and "value" in collect_runs(tmp_path).columns
    run = fx.write_run(tmp_path, "full", None, 1, evals=None)
    (run / "status.json").unlink()
    assert collect_runs(tmp_path).empty
    assert run_states(tmp_path)["state"].tolist() == ["unknown"]


def test_runs_differing_beyond_seed_are_separate_arms(tmp_path):
    fx.write_run(tmp_path, "stare", None, 1, evals={"arithmetic": 0.5})
    fx.write_run(tmp_path, "stare", None, 2, evals={"arithmetic": 0.6}, extra_config={"trainer.learning_rate": 2e-6})
    arms = set(collect_runs(tmp_path)["arm"])
    assert arms == {"stare trainer.learning_rate=1e-06", "stare trainer.learning_rate=2e-06"}


# ------------------------------------------------------------------------------------ tables


def test_results_table_cells(table):
    cells = table.cells.set_index(["rule", "benchmark"])
    assert len(cells) == len(EXPECTED)
    for key, (mean, std, n, delta, best) in EXPECTED.items():
        row = cells.loc[key]
        assert row["mean"] == pytest.approx(mean), key
        assert row["std"] == pytest.approx(std, nan_ok=True), key
        assert row["n_seeds"] == n and bool(row["best"]) == best, key
        assert row["delta"] == pytest.approx(delta, abs=1e-12), key
    assert table.rules == ["full", RSI, "stare"]
    assert table.columns == ["aime24", "arithmetic", "Avg."]
    assert table.pivot("mean").loc["stare", "arithmetic"] == pytest.approx(0.56)


def test_markdown(table):
    """Without per-problem samples: the differences carry no interval and nothing is bold (the best mean
    is not a claim)."""
    md = table.to_markdown()
    assert "| rule | seeds | aime24 (30) | arithmetic (4) | Avg. |" in md  # each column's number of problems
    assert "Problems: aime24: aime24.jsonl; arithmetic: the built-in arithmetic task's held-out split." in md
    assert "| full | 3 | 20.0 ± 10.0 | 52.0 ± 2.0 | 36.0 |" in md
    assert f"| {RSI} | 2 | 30.0 ± 7.1 (+10.0) | 49.0 ± 1.4 (-3.0) | 39.5 (+3.5) |" in md
    assert "| stare | 3 | 20.0 ± 5.0 (+0.0) | 56.0 ± 1.0 (+4.0) | 38.0 (+2.0) |" in md
    assert md.count("**") == 0 and "No per-problem samples" in md


def test_markdown_with_intervals(compared):
    """With samples: the same means, stds and differences, each difference with its interval; with 2-3
    seeds and 4 or 30 problems none excludes 0 after Holm, so none is bold."""
    md = compared.to_markdown()
    assert "| full | 3 | 20.0 ± 10.0 | 52.0 ± 2.0 | 36.0 |" in md
    assert f"| {RSI} | 2 | 30.0 ± 7.1 (+10.0 [" in md and "| stare | 3 | 20.0 ± 5.0 (+0.0 [" in md
    assert "| 49.0 ± 1.4 (-3.0 [" in md and "| 38.0 (+2.0 [" in md
    assert md.count("**") == 0 and set(compared.cells["verdict"]) == {"", "n.s."}
    assert md.startswith("Table: avg@32 in %, 3 arms × 2-3 seeds; problems: aime24 30, arithmetic 4.")
    cells = compared.cells.set_index(["rule", "benchmark"])
    for key, (mean, std, n, delta, _) in EXPECTED.items():
        assert cells.loc[key, "mean"] == pytest.approx(mean) and cells.loc[key, "n_seeds"] == n, key
        assert cells.loc[key, "std"] == pytest.approx(std, nan_ok=True), key
        assert cells.loc[key, "delta"] == pytest.approx(delta, abs=1e-12), key
        if key[0] != "full":
            assert cells.loc[key, "ci_lo"] < cells.loc[key, "delta"] < cells.loc[key, "ci_hi"], key


def test_settings_line(table):
    assert (
        "Evaluation: T=1.0, top-p=0.7, n=32; max tokens: aime24 4096, arithmetic 256; "
        "verifier: aime24 math_verify, arithmetic exact."
    ) in table.notes
    assert not any(n.startswith(("missing", "Settings disagree")) for n in table.notes)


def test_settings_disagreement_is_stated(tmp_path):
    fx.write_run(tmp_path, "full", None, 1, evals={"arithmetic": 0.5})
    hot = {**fx.SETTINGS, "arithmetic": {**fx.SETTINGS["arithmetic"], "temperature": 0.6}}
    fx.write_run(tmp_path, "full", None, 2, evals={"arithmetic": 0.6}, settings=hot)
    df = collect_runs(tmp_path)
    with pytest.raises(
        SettingsMismatch,
        match=r"^arithmetic: runs were evaluated with different settings "
        r"\(n=32, T=0.6, top-p=0.7, max tokens 256, exact: 1 runs; n=32, T=1.0, .*: 1 runs\)",
    ):
        results_table(df)  # one column would mix T=0.6 and T=1.0
    notes = results_table(df, mix_settings=True).notes
    assert "Settings disagree: T on arithmetic: 0.6 (runs full-s2); 1.0 (runs full-s1)." in notes
    only = results_table(df, where={"temperature": 0.6})
    assert only.cells.set_index("rule").loc["full", "mean"] == pytest.approx(0.6)
    assert "Evaluation: T=0.6, top-p=0.7, n=32, max tokens=256, verifier=exact." in only.notes


def test_a_run_evaluated_under_two_settings_shows_the_common_one_and_names_the_other(tmp_path):
    for seed, avg in ((1, 0.5), (2, 0.6)):
        fx.write_run(tmp_path, "full", None, seed, evals={"arithmetic": avg})
    run = tmp_path / fx.SWEEP / fx.run_id("full", None, 2)
    extra = {
        "benchmark": "arithmetic",
        "step": 50,
        "final": True,
        **fx.SETTINGS["arithmetic"],
        "n": 64,
        "metrics": {"avg@64": 0.9},
    }
    (run / "eval" / "arithmetic").mkdir()
    (run / "eval" / "arithmetic" / "step-50_n64_t1_p0.7_m256_exact.json").write_text(json.dumps(extra))
    table = results_table(collect_runs(tmp_path))
    assert table.cells.set_index("rule").loc["full", "mean"] == pytest.approx(0.55)  # n=32 for both runs
    assert (
        "arithmetic: also evaluated with n=64, T=1.0, top-p=0.7, max tokens 256, exact (1 runs); "
        "not shown (choose with --where)."
    ) in table.notes


def test_csv_round_trip(table):
    back = pd.read_csv(io.StringIO(table.to_csv()), keep_default_na=False, na_values=[""])
    # issue 27.9: the printed table's units, named in the columns (EXPECTED: fractions)
    assert list(back.columns) == ["rule", "benchmark", "mean_pct", "std_pct", "n_seeds", "delta_pts", "best"]
    back = back.set_index(["rule", "benchmark"])
    for key, (mean, std, n, delta, best) in EXPECTED.items():
        row = back.loc[key]
        assert row["mean_pct"] == pytest.approx(100 * mean) and row["n_seeds"] == n, key
        assert row["std_pct"] == pytest.approx(100 * std, nan_ok=True)
        assert row["delta_pts"] == pytest.approx(100 * delta, abs=1e-9)
        assert (row["best"] == "*") == best, key


def _strip_escaped(tex: str) -> str:
    return tex.replace(r"\{", "").replace(r"\}", "").replace(r"\&", "")


def test_latex_is_valid(table, tmp_path):
    tex = table.to_latex()
    for rule in (r"\toprule", r"\midrule", r"\bottomrule", r"\begin{tabular}", r"\end{tabular}"):
        assert tex.count(rule) == 1, rule
    plain = _strip_escaped(tex)
    depth = 0
    for ch in plain:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0]
    header = tex.split(r"\toprule")[1].split(r"\midrule")[0]
    rows = [r for r in (header + body).split(r"\\") if r.strip()]
    assert len(rows) == 4 and {_strip_escaped(r).count("&") for r in rows} == {4}
    assert r"rsi\_band[0.5,1] & 2 & 30.0 $\pm$ 7.1 (+10.0) &" in tex
    assert tex.count(r"\textbf{") == 0 and "math\\_verify" in tex
    assert re.search(r"\\begin\{tabular\}\{lrrrr\}", tex)
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not on PATH: structure checked, compilation skipped")
    doc = tmp_path / "t.tex"
    doc.write_text("\\documentclass{article}\\usepackage{booktabs}\\begin{document}\n" + tex + "\\end{document}\n")
    proc = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]


def test_incomplete_sweep(incomplete):
    df = collect_runs(incomplete)
    assert "ict-s1" not in set(df["run"])
    table = results_table(df, expected=run_states(incomplete))
    assert "missing: rule ict (no results: runs ict-s1 [seed 1, failed])." in table.notes
    md = table.to_markdown()
    assert "| ict | 0 | – | – | – |" in md and "missing: rule ict" in md
    assert table.pivot("mean").loc["stare", "arithmetic"] == pytest.approx(0.56)
    assert "ict" in table.to_latex() and table.pivot("best").loc["stare", "arithmetic"]


def test_missing_benchmark_of_one_run(tmp_path):
    fx.write_run(tmp_path, "full", None, 1, evals={"arithmetic": 0.5, "aime24": 0.1})
    fx.write_run(tmp_path, "full", None, 2, evals={"arithmetic": 0.7})
    table = results_table(collect_runs(tmp_path))
    assert "missing: aime24 of run full-s2 (full)." in table.notes
    assert table.pivot("n_seeds").loc["full"].tolist() == [1, 2, 1]
    assert "| full | 1-2 | 10.0 | 60.0 ± 14.1 | 35.0 |" in table.to_markdown()  # one seed: no ±


def test_explicit_metric_and_baseline(sweep):
    df = collect_runs(sweep)
    t = results_table(df, metric="pass@1", baseline="stare", benchmarks=["arithmetic"])
    assert t.columns == ["arithmetic"] and t.rules[0] == "stare"
    assert t.pivot("delta").loc["full", "arithmetic"] == pytest.approx(-0.04)


def test_passk_table(sweep):
    t = passk_table(collect_runs(sweep), "aime24")
    assert t.columns == list(fx.KS)
    for arm, key in (("full", ("full", None)), (RSI, ("rsi_band", "[0.5,1]"))):
        for k in fx.KS:
            vals = [fx.pass_at(v["aime24"], k) for (m, var, _), v in fx.AVG.items() if (m, var) == key]
            assert t.pivot("mean").loc[arm, k] == pytest.approx(np.mean(vals))
            assert t.pivot("std").loc[arm, k] == pytest.approx(np.std(vals, ddof=1))
    assert t.pivot("best")[1].idxmax() == RSI
    back = pd.read_csv(io.StringIO(t.to_csv()))
    assert list(back.columns[:2]) == ["rule", "k"] and sorted(set(back["k"])) == list(fx.KS)
    assert "| rule | seeds | pass@1 | pass@2 |" in t.to_markdown()


# ------------------------------------------------------------------------------------ plots


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_training(incomplete, tmp_path):
    paths = plot_training(collect_training(incomplete), tmp_path)
    names = sorted(p.name for p in paths)
    assert names == sorted(
        [
            "train_reward.png",
            "train_entropy.png",
            "train_tokens_trained_frac.png",
            "train_tokens_touched_frac.png",
            "train_rule_gate.png",
            "train_rule_kept_frac.png",
            "train_rule_low_frac.png",
            "train_rule_high_frac.png",
        ]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    assert all(_png_size(p) == (640, 400) for p in paths)
    with pytest.raises(ValueError, match="no training metric nope"):
        plot_training(collect_training(incomplete), tmp_path, metrics=["nope"])


def test_plot_passk(sweep, tmp_path):
    paths = plot_passk(collect_runs(sweep), tmp_path)
    assert sorted(p.name for p in paths) == ["passk_aime24.png", "passk_arithmetic.png"]
    assert all(_png_size(p) == (640, 400) for p in paths)


def test_the_analysis_names_resolve_lazily_to_their_modules():
    import subprocess
    import sys

    import stare_lab.analysis as analysis

    assert sorted(analysis.__all__) == sorted(analysis._HOMES)
    for name in analysis.__all__:
        assert getattr(analysis, name).__module__ == analysis._HOMES[name], name
    code = "import sys; from stare_lab.analysis import results_table; print('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
