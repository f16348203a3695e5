"""Issue 27.7: the intervals a table and a forest plot show are per comparison; bold and colour are Holm's.

A difference whose per-comparison interval excludes 0 while Holm's p over the arms of its column does not fall
below 0.05 must not look significant without the reason: the table marks it † (never bold) and says why under
it, the caption says the intervals are per comparison, and the forest plot draws it hollow and orange with a
legend naming that case. Issue 27.6's 2-seed rule is stated under a 2-seed table.
"""

from __future__ import annotations

from pathlib import Path

import fixtures_runs as fx
import pytest
from matplotlib.colors import to_rgba

from stare_lab.analysis import collect_problems, collect_runs, compare_arms, results_table
from stare_lab.analysis.compare import TWO_SEEDS
from stare_lab.analysis.plots import FOREST_STYLES, forest_figure, forest_rows

# aime24 (30 problems), 3 seeds: stare +30 (better after Holm); ict +12 (its interval [+0.6, +23.7] excludes 0,
# p 0.039, but Holm over the 6 arms makes it 0.197: n.s.); four arms within noise of full.
ARMS = {
    ("full", None): (0.50, 0.51, 0.52),
    ("stare", None): (0.80, 0.81, 0.82),
    ("ict", None): (0.62, 0.635, 0.64),
    ("rsi_band", None): (0.51, 0.50, 0.53),
    ("rsi_band", "[0.5,1]"): (0.49, 0.52, 0.51),
    ("ict", "[b]"): (0.50, 0.52, 0.50),
    ("stare", "[b]"): (0.51, 0.51, 0.50),
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    return fx.write_arms(tmp_path_factory.mktemp("holm"), ARMS)


@pytest.fixture(scope="module")
def table(sweep):
    return results_table(collect_runs(sweep), per_problem=collect_problems(sweep))


def test_the_case_excludes_0_per_comparison_but_not_after_holm(table):
    """The numbers the rest rests on (measured: ict p 0.0394, p_holm 0.197 = 5 × 0.0394, the second smallest
    of 6 p-values)."""
    cmp = table.comparison.set_index("arm")
    assert cmp.loc["ict", "ci_lo"] > 0 and cmp.loc["ict", "excludes_0"]
    assert cmp.loc["ict", "p_value"] < 0.05 < cmp.loc["ict", "p_holm"]
    assert cmp.loc["ict", "p_holm"] == pytest.approx(5 * cmp.loc["ict", "p_value"])
    assert cmp.loc["ict", "verdict"] == "n.s." and cmp.loc["stare", "verdict"] == "better"
    # compare_arms' own column agrees with its intervals everywhere
    assert (cmp["excludes_0"] == ((cmp["ci_lo"] > 0) | (cmp["ci_hi"] < 0))).all()


def test_the_table_marks_it_with_a_dagger_never_bold_and_says_why(table):
    cells = table.cells.set_index("rule")
    assert not cells.loc["ict", "bold"] and cells.loc["ict", "dagger"]
    assert cells.loc["stare", "bold"] and not cells.loc["stare", "dagger"]
    assert not cells[["bold", "dagger"]].drop(index=["ict", "stare"]).to_numpy().any()
    md = table.to_markdown()
    rows = {
        line.split(" | ")[0].lstrip("| "): line for line in md.split("\n\n")[1].splitlines() if line.startswith("|")
    }
    assert rows["ict"].endswith("(+12.2 [+0.6, +23.7]) † |") and "**" not in rows["ict"]
    assert md.count("†") == 3  # the cell, the caption's key, the note
    note = next(n for n in table.notes if n.startswith("†"))
    assert "after Holm's correction over the 6 arms p_holm ≥ 0.05" in note
    assert "ict on aime24 (p 0.039, p_holm 0.2)" in note
    tex = table.to_latex()
    assert r"(+12.2 [+0.6, +23.7]) $^\dagger$" in tex and tex.count(r"\textbf{") == 1
    assert r"p\_holm $\geq$ 0.05" in tex  # the note, escaped


def test_the_caption_says_the_intervals_are_per_comparison_and_the_bold_is_holms(table):
    cap = table.caption
    assert "per-comparison 95% intervals" in cap and "not adjusted for the 6 arms" in cap
    assert "bold: better/worse after Holm's correction over the 6 arms (p_holm < 0.05)" in cap
    assert "†: the interval excludes 0 but p_holm ≥ 0.05" in cap
    assert "after Holm" not in cap.split("bold:")[0]  # nothing says the intervals are Holm's
    assert any(n.startswith("Intervals: 95% per comparison") for n in table.notes)


def test_the_forest_plot_draws_it_hollow_orange_and_its_legend_says_so(table):
    rows = forest_rows(table.comparison).set_index("arm")
    assert rows.loc["ict", "style"] == "not_after_holm" and rows.loc["stare", "style"] == "better"
    assert set(rows.drop(index=["ict", "stare"])["style"]) == {"n.s."}
    fig = forest_figure(forest_rows(table.comparison), "aime24", "full", "avg@32", 0.95, arms=6)
    (ax,) = fig.axes
    assert "per-comparison 95% intervals" in ax.get_title() and "Holm over 6 arms" in ax.get_title()
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["better: Holm p < 0.05", "interval excludes 0, n.s. after Holm", "n.s.: interval holds 0"]
    # each arm's marker: drawn in its row (arms sorted by difference), coloured by its style
    order = forest_rows(table.comparison).sort_values(["delta", "arm"])["arm"].tolist()
    drawn = {order[i]: c.lines[0] for i, c in enumerate(ax.containers)}
    assert to_rgba(drawn["ict"].get_color()) == to_rgba("tab:orange")
    assert to_rgba(drawn["ict"].get_markerfacecolor()) == to_rgba("white")  # hollow
    assert to_rgba(drawn["stare"].get_markerfacecolor()) == to_rgba(FOREST_STYLES["better"][1]["color"])
    assert drawn["ict"].get_ydata()[0] == order.index("ict")


def test_a_two_seed_table_states_the_two_seed_rule(tmp_path, table):
    fx.write_arms(tmp_path, {("full", None): (0.50, 0.60), ("stare", None): (0.52, 0.66)})
    t = results_table(collect_runs(tmp_path), per_problem=collect_problems(tmp_path))
    assert "at 2 seeds the seed part at t(1)" in t.caption
    assert any(n.startswith("2 seeds: the seed variance rests on 1 degree of freedom") for n in t.notes)
    (row,) = t.comparison.to_dict("records")
    assert row["note"] == TWO_SEEDS and 1.0 <= row["df"] < 29  # between the seed part's df and the problems'
    # the 3-seed table says nothing of it
    assert "t(1)" not in table.caption and not any(n.startswith("2 seeds") for n in table.notes)


def test_compare_arms_excludes_0_is_false_without_an_interval():
    import pandas as pd

    data = pd.DataFrame(
        [
            {"arm": arm, "seed": 0, "benchmark": "b", "problem": f"p{i}", "correct": c, "n": 10}
            for arm, counts in {"full": [5, 5, 5], "arm": [5, 5, 5]}.items()
            for i, c in enumerate(counts)
        ]
    )
    (row,) = compare_arms(data).to_dict("records")
    assert row["ci_lo"] == row["ci_hi"] == 0.0 and not row["excludes_0"]
