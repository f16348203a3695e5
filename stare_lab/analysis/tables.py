"""Result tables: rule × benchmark (or rule × k) with mean ± std over seeds, Δ vs a baseline.

The differences carry their per-comparison interval over seeds and problems where the runs kept
per-problem samples (differences.py, compare.py); a cell is bold only where Holm's correction over the
arms of its column leaves p < 1 − confidence, marked better or worse; ties and leads within noise are
never bold, and an interval that excludes 0 without surviving Holm is marked † and explained under
the table. Arms that differ in a setting besides their rule are named under it (notes.confound_notes).

Input is `collect_runs`' long frame; only final evaluations count, one evaluation setting per
benchmark column (collect.select_settings). Each run is one sample of its arm (see collect.py:
runs differing only in seed share an arm). The evaluation settings are read from the same records
and stated under every table (settings differ between papers, so every table says T, top-p, n,
max tokens and the verifier).
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

import stare_lab.analysis.differences as differences
from stare_lab.analysis.compare import AVG_COLUMN
from stare_lab.analysis.notes import (
    benchmark_columns,
    code_notes,
    confound_notes,
    duplicate_notes,
    missing_notes,
    settings_notes,
)
from stare_lab.core.controls import BASE
from stare_lab.record.frames import select_settings

_AVG_METRIC = re.compile(r"^avg@(\d+)$")
_PASS_METRIC = re.compile(r"^pass@(\d+)$")


# results.csv's columns in the printed table's units: levels in percent, differences in percentage points
CSV_UNITS = {"mean": "mean_pct", "std": "std_pct", "delta": "delta_pts", "ci_lo": "ci_lo_pts", "ci_hi": "ci_hi_pts"}


@dataclass
class Table:
    """A formatted results table.

    cells: tidy numeric frame, one row per (rule, column): rule, <column_name>, mean, std
        (over seeds, ddof=1; NaN with one seed), n_seeds, delta (mean − baseline mean; NaN where
        the baseline has no value), best (bool: highest mean of its column, ties all marked;
        never in a column with fewer than two values; a fact, not a claim: it is not shown in
        bold), and from compare_arms where the runs kept samples: ci_lo, ci_hi (the difference's
        interval), p_value, p_holm, verdict (better / worse / n.s.), seeds_needed (for 2 points),
        bold (verdict is better or worse).
        Values are fractions; the text formats and to_csv show percent (levels) and points (differences).
    rules: row order (baseline first). columns: column order (the "Avg." column last, if any).
    notes: lines stated under the table (values, evaluation settings, disagreements, missing).
    comparison: compare_arms' frame (points) or None; caption: method, confidence, seeds, problems.
    """

    cells: pd.DataFrame
    rules: list[str]
    columns: list
    metric: str
    baseline: str | None
    notes: list[str] = field(default_factory=list)
    column_name: str = "benchmark"
    column_labels: dict = field(default_factory=dict)
    comparison: pd.DataFrame | None = None
    caption: str | None = None
    confidence: float = 0.95
    identical: frozenset[str] = frozenset()  # arms that trained exactly as the baseline (identical_in_training)

    def pivot(self, value: str = "mean") -> pd.DataFrame:
        """rule × column frame of one of mean, std, n_seeds, delta, best."""
        wide = self.cells.pivot(index="rule", columns=self.column_name, values=value)
        return wide.reindex(index=self.rules, columns=self.columns)

    def _label(self, column) -> str:
        return str(self.column_labels.get(column, column))

    def _text_rows(self, latex: bool) -> list[tuple[list[str], list[bool]]]:
        cells = self.cells.set_index(["rule", self.column_name])
        rows = []
        for rule in self.rules:
            texts, bests = [], []
            for col in self.columns:
                row = cells.loc[(rule, col)] if (rule, col) in cells.index else None
                if rule in self.identical and row is not None:  # the same training: no difference to measure
                    texts.append(_identical_text(row, str(self.baseline), latex))
                    bests.append(False)
                    continue
                texts.append(
                    # base's cell: the baseline's RL gain (unless base is the baseline itself: --baseline base)
                    _cell_text(
                        row,
                        rule == self.baseline,
                        latex,
                        gain_of=self.baseline if rule == BASE != self.baseline else None,
                    )
                )
                bests.append(row is not None and bool(row.get("bold", False)))
            rows.append((texts, bests))
        return rows

    def _seeds_text(self, rule: str) -> str:
        counts = self.cells.loc[(self.cells["rule"] == rule) & (self.cells[self.column_name] != AVG_COLUMN), "n_seeds"]
        counts = sorted({int(c) for c in counts if c > 0})
        if not counts:
            return "0"
        return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"

    def seeds_markdown(self, delta: float = 2.0, power: float = 0.8) -> str:
        """Seeds per arm to detect `delta` points with `power` (differences.seeds_markdown)."""
        return differences.seeds_markdown(self.comparison, self.columns, delta, power, self.confidence)

    def to_markdown(self) -> str:
        """Caption, GitHub markdown table (bold: better/worse after Holm), the notes as paragraphs, and
        the seeds-needed table where there are intervals."""
        header = ["rule", "seeds"] + [self._label(c) for c in self.columns]
        lines = ["| " + " | ".join(header) + " |", "|:--|--:|" + "--:|" * len(self.columns)]
        for rule, (texts, bests) in zip(self.rules, self._text_rows(latex=False), strict=True):
            shown = [f"**{t}**" if b else t for t, b in zip(texts, bests, strict=True)]
            lines.append("| " + " | ".join([rule, self._seeds_text(rule)] + shown) + " |")
        head = f"Table: {self.caption}\n\n" if self.caption else ""
        text = head + "\n".join(lines) + "\n\n" + "\n\n".join(self.notes) + "\n"
        if self.comparison is not None and not self.comparison.empty:
            text += "\n" + self.seeds_markdown()
        return text

    def to_latex(self, caption: str | None = None) -> str:
        """A booktabs `table` float (needs \\usepackage{booktabs}); better/worse cells in \\textbf;
        caption: default the table's own (method, confidence, seeds, problems)."""
        ncol = 2 + len(self.columns)
        header = ["Rule", "Seeds"] + [latex_escape(self._label(c)) for c in self.columns]
        out = [
            r"\begin{table}[t]",
            r"\centering",
            r"\small",
            r"\begin{tabular}{l" + "r" * (ncol - 1) + "}",
            r"\toprule",
            " & ".join(header) + r" \\",
            r"\midrule",
        ]
        for rule, (texts, bests) in zip(self.rules, self._text_rows(latex=True), strict=True):
            shown = [rf"\textbf{{{t}}}" if b else t for t, b in zip(texts, bests, strict=True)]
            first = latex_escape(rule)
            first = "{}" + first if first.startswith("[") else first  # `\\[` would read as a length
            out.append(" & ".join([first, self._seeds_text(rule)] + shown) + r" \\")
        out += [r"\bottomrule", r"\end{tabular}"]
        notes = self.notes + [line for line in [differences.seeds_line(self.comparison)] if line]
        if notes:
            out += [r"\par\smallskip", r"{\footnotesize " + r" \par ".join(latex_escape(n) for n in notes) + "}"]
        caption = caption or self.caption
        if caption:
            out.append(r"\caption{" + latex_escape(caption) + "}")
        out.append(r"\end{table}")
        return "\n".join(out) + "\n"

    def to_csv(self, path=None) -> str:
        """Tidy numeric CSV in the units of the printed table, each named in its column: rule,
        <column_name>, mean_pct and std_pct (percent of the metric, e.g. avg@32 × 100), n_seeds, delta_pts
        (difference to the baseline in percentage points), best ("*": highest mean, or empty), and where
        there are intervals ci_lo_pts and ci_hi_pts (the per-comparison interval of delta_pts, as compare_arms'
        delta, ci_lo, ci_hi), p_value, p_holm, verdict (better / worse after Holm, or n.s.), excludes_0 (the
        interval excludes 0; with verdict n.s. the table's †) and seeds_needed (seeds per arm for a 2-point
        difference at power 0.8). Written to `path` too when given.
        """
        extra = [
            c
            for c in ("ci_lo", "ci_hi", "p_value", "p_holm", "verdict", "excludes_0", "seeds_needed")
            if c in self.cells
        ]
        if self.comparison is None:
            extra = []
        frame = self.cells[["rule", self.column_name, "mean", "std", "n_seeds", "delta", "best", *extra]].copy()
        frame["best"] = np.where(frame["best"], "*", "")
        if self.identical:  # a column only where some arm trained exactly as the baseline
            frame["identical_in_training"] = frame["rule"].isin(self.identical)
        for column in ("mean", "std", "delta", "ci_lo", "ci_hi"):
            if column in frame:  # fractions → the table's percent and points (rounded off float noise)
                frame[column] = (frame[column].astype(float) * 100).round(10)
        frame = frame.rename(columns=CSV_UNITS)
        if self.baseline is not None and (frame["rule"] == BASE).any():  # the baseline's RL gain, on base's rows
            on_base = frame["rule"] == BASE
            frame["rl_gain_pts"] = (0.0 - frame["delta_pts"]).where(on_base) + 0.0  # + 0.0: no "-0.0"
            if "ci_lo_pts" in frame:
                frame["rl_gain_lo_pts"] = (0.0 - frame["ci_hi_pts"]).where(on_base) + 0.0
                frame["rl_gain_hi_pts"] = (0.0 - frame["ci_lo_pts"]).where(on_base) + 0.0
        buf = io.StringIO()
        frame.to_csv(buf, index=False)
        text = buf.getvalue()
        if path is not None:
            with open(path, "w") as fh:
                fh.write(text)
        return text

    def __str__(self) -> str:
        return self.to_markdown()


# What a run's training is compared by, at every logged step: the gradient norm before clipping, the mean
# reward of the step's rollouts and TRL's entropy of the policy on them (the same weights draw the same
# rollouts under the same seed). Not the loss's value: a rule that changes the loss can give another value
# with the same gradient (dppo on-policy: −A·sg(min(r, C))·log π against −r·A, both −A·∇log π at r = 1).
TRAINING_KEYS = ("grad_norm", "reward", "entropy")


def identical_in_training(training: pd.DataFrame, baseline: str | None) -> frozenset[str]:
    """The arms whose every seed trained exactly as the baseline's run of that seed: the same logged steps
    and, at each, the same gradient norm, mean reward and policy entropy to the bit (`TRAINING_KEYS`;
    `training`: `collect_training` output).

    Such an arm touched no token's update: on a strictly on-policy layout (one optimizer step per
    generation batch) the ratio is 1, PPO's clip never acts, and rules that act only through it (archer,
    ce_gppo, dppo, stapo on the built-in testbed) train as `full`. Its difference to the baseline is 0 by
    construction, not a tie measured on the data, and the table says so instead of printing +0.0. An arm
    with a seed the baseline lacks, a run without logged steps, or any differing value is not identical;
    the untrained `base` (no steps) never is."""
    if baseline is None or training is None or training.empty:
        return frozenset()
    rows = training[training["metric"].isin(TRAINING_KEYS)]
    series = {
        (arm, seed): tuple(sorted(zip(g["step"], g["metric"], g["value"], strict=True)))
        for (arm, seed), g in rows.groupby(["arm", "seed"], sort=False)
    }
    seeds: dict[str, set] = {}
    for arm, seed in series:
        seeds.setdefault(arm, set()).add(seed)
    base_seeds = seeds.get(baseline, set())
    return frozenset(
        arm
        for arm, own in seeds.items()
        if arm not in (baseline, BASE)
        and own <= base_seeds
        and all(series[(arm, s)] and series[(arm, s)] == series[(baseline, s)] for s in own)
    )


def _identical_text(row, baseline: str, latex: bool) -> str:
    """ "76.2 ± 2.9 (identical to full in training)": the arm's level, and why it shows no difference."""
    text = _pct(row["mean"])
    if np.isfinite(row["std"]):
        text += (r" $\pm$ " if latex else " ± ") + _pct(row["std"])
    return text + f" (identical to {baseline} in training)"


def _pct(x: float) -> str:
    return f"{x * 100:.1f}"


def _signed(x: float) -> str:
    v = round(x * 100, 1)
    return f"{0.0 if v == 0 else v:+.1f}"


def _cell_text(row, is_baseline: bool, latex: bool, gain_of: str | None = None) -> str:
    """ "54.4 ± 1.2 (+2.1 [-1.0, +5.2])", with " better" / " worse" (after Holm), or " †" where the
    per-comparison interval excludes 0 but Holm's p does not fall below α; "--" where there is no value.
    gain_of: the base row's, whose difference is shown as the baseline's RL gain (baseline − base)."""
    if row is None or not np.isfinite(row["mean"]):
        return "--" if latex else "–"
    text = _pct(row["mean"])
    if np.isfinite(row["std"]):
        text += (r" $\pm$ " if latex else " ± ") + _pct(row["std"])
    if gain_of is not None and np.isfinite(row["delta"]):
        return text + _gain_text(row, gain_of, latex)
    if not is_baseline and np.isfinite(row["delta"]):
        interval = ""
        if np.isfinite(row.get("ci_lo", np.nan)):
            interval = f" [{_signed(row['ci_lo'])}, {_signed(row['ci_hi'])}]"
        text += f" ({_signed(row['delta'])}{interval})"
        if row.get("verdict") in ("better", "worse"):
            text += f" {row['verdict']}"
        elif bool(row.get("dagger", False)):  # the interval excludes 0, Holm does not: never bold, explained
            text += r" $^\dagger$" if latex else " †"
    return text


def _gain_text(row, baseline: str, latex: bool) -> str:
    """ " (RL gain of full +40.2 [+35.1, +45.3] significant)": baseline − base, the base row's difference
    with its sign turned, its interval likewise; "significant" where Holm leaves it better or worse."""
    gain = f" (RL gain of {baseline} {_signed(-row['delta'])}"
    if np.isfinite(row.get("ci_lo", np.nan)):
        gain += f" [{_signed(-row['ci_hi'])}, {_signed(-row['ci_lo'])}]"
    if row.get("verdict") in ("better", "worse"):
        gain += " significant"
    elif bool(row.get("dagger", False)):
        gain += r" $^\dagger$" if latex else " †"
    return gain + ")"


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "–": "--",
    "≠": r"$\neq$",
    "…": r"\ldots{}",
    "†": r"$^\dagger$",
    "≥": r"$\geq$",
    "×": r"$\times$",
    "∞": r"$\infty$",
    "α": r"$\alpha$",
    "²": r"$^2$",
    "<": r"$<$",  # in text mode OT1 sets < as ¡
    ">": r"$>$",
}


def latex_escape(text: str) -> str:
    """Escape LaTeX specials (and the few non-ASCII symbols the notes use) in plain text."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


# ---------------------------------------------------------------------------------------------
# Aggregation


def _final(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return df.assign(arm=pd.Series(dtype=str))
    final = df[df["final"].astype(bool)] if "final" in df.columns else df
    key = "arm" if "arm" in final.columns else "rule"
    return final.assign(arm=final[key].astype(str))


def _choose_metric(final: pd.DataFrame, benchmark: str, metric: str | None, notes: list[str]) -> str | None:
    """The metric of one benchmark: `metric`, or the avg@n most runs report (auto)."""
    rows = final[final["benchmark"] == benchmark]
    if metric is not None:
        return metric
    counts = rows[rows["metric"].str.match(_AVG_METRIC)].groupby("metric")["run"].nunique()
    if counts.empty:
        return None
    if len(counts) > 1:
        notes.append(f"{benchmark}: runs report {', '.join(sorted(counts.index))}; using {counts.idxmax()}.")
    return str(counts.idxmax())


def _aggregate(
    values: pd.DataFrame, rules: list[str], columns: list, column_name: str, baseline: str | None
) -> pd.DataFrame:
    """values: rows (arm, column, run, value) → tidy cells with mean/std/n_seeds/delta/best."""
    rows = []
    for rule in rules:
        for col in columns:
            v = values.loc[(values["arm"] == rule) & (values["column"] == col), "value"].to_numpy(float)
            n = len(v)
            rows.append(
                {
                    "rule": rule,
                    column_name: col,
                    "mean": v.mean() if n else math.nan,
                    "std": v.std(ddof=1) if n > 1 else math.nan,
                    "n_seeds": n,
                }
            )
    cells = pd.DataFrame(rows, columns=["rule", column_name, "mean", "std", "n_seeds"])
    return _add_delta_best(cells, column_name, baseline)


def _add_delta_best(cells: pd.DataFrame, column_name: str, baseline: str | None) -> pd.DataFrame:
    base = cells[cells["rule"] == baseline].set_index(column_name)["mean"]
    cells["delta"] = cells["mean"] - cells[column_name].map(base).astype(float)
    by_col = cells.groupby(column_name, sort=False)["mean"]
    top, compared = by_col.transform("max"), by_col.transform("count")
    # a column with a single value has no "best" to mark
    cells["best"] = (compared >= 2) & np.isclose(cells["mean"], top, rtol=0, atol=1e-12)
    return cells


def _with_average(cells: pd.DataFrame, rules: list[str], columns: list, baseline: str | None) -> pd.DataFrame:
    """Append the "Avg." column: mean over benchmarks of each rule's mean (only where a rule
    has every benchmark; a partial average would not compare)."""
    rows = []
    for rule in rules:
        part = cells[cells["rule"] == rule]
        means = part["mean"].to_numpy(float)
        complete = len(means) == len(columns) and np.isfinite(means).all()
        rows.append(
            {
                "rule": rule,
                "benchmark": AVG_COLUMN,
                "mean": means.mean() if complete else math.nan,
                "std": math.nan,
                "n_seeds": int(part["n_seeds"].min()) if len(part) else 0,
            }
        )
    avg = _add_delta_best(pd.DataFrame(rows), "benchmark", baseline)
    return pd.concat([cells, avg], ignore_index=True)


def _order_rules(arms: list[str], baseline: str | None) -> list[str]:
    """base (the untrained model) first, then the baseline, then the other arms alphabetically."""
    arms = sorted(dict.fromkeys(arms))
    first = list(dict.fromkeys(a for a in (BASE, baseline) if a in arms))
    return first + [a for a in arms if a not in first]


# ---------------------------------------------------------------------------------------------
# Public API


def results_table(
    df: pd.DataFrame,
    metric: str | None = None,
    baseline: str | None = "full",
    benchmarks: list[str] | None = None,
    expected: pd.DataFrame | None = None,
    where: dict | None = None,
    mix_settings: bool = False,
    per_problem: pd.DataFrame | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    training: pd.DataFrame | None = None,
) -> Table:
    """Rule × benchmark table of `metric` (default: each benchmark's avg@n) over final evaluations.

    df: `collect_runs` output. baseline: the arm Δ is taken against (None: no Δ); an arm with
    results, else ComparisonError (so is a benchmark the baseline lacks, or arms of one benchmark
    evaluated under different settings or problem sets). per_problem: `collect_problems` output;
    with it each avg@n difference gets its interval at `confidence` (compare_arms; `seed`: its
    bootstrap's), p-values, Holm, the verdict that alone makes a cell bold, and the seeds needed.
    expected: the runs that should have results (e.g. `run_states(root)`: columns run, arm or
    rule, seed, optionally state, code); rules and runs among them without results are listed in a
    "missing: ..." note and rules without any result get a row of dashes; runs from several code
    versions get a warning note. where / mix_settings: see `collect.select_settings` (a column
    never silently mixes evaluation settings: SettingsMismatch). training: `collect_training` output;
    with it an arm whose every seed trained exactly as the baseline's is shown as "identical to
    <baseline> in training" (`identical_in_training`) instead of a difference of 0.
    """
    final, settings_picked = select_settings(_final(df), where, mix_settings)
    if benchmarks is None:
        benchmarks = sorted(final["benchmark"].unique()) if len(final) else []
    notes: list[str] = []
    metrics = {b: _choose_metric(final, b, metric, notes) for b in benchmarks}
    values = pd.concat(
        [
            final[(final["benchmark"] == b) & (final["metric"] == m)].assign(column=b)
            for b, m in metrics.items()
            if m is not None
        ]
        or [pd.DataFrame(columns=["arm", "column", "run", "value"])]
    )
    values = values.drop_duplicates(["run", "column"], keep="last")
    arms = list(values["arm"]) + (list(_expected_arms(expected)) if expected is not None else [])
    rules = _order_rules(arms, baseline)
    cells = _aggregate(values, rules, benchmarks, "benchmark", baseline)
    columns = list(benchmarks)
    if len(benchmarks) > 1:
        cells = _with_average(cells, rules, benchmarks, baseline)
        columns.append(AVG_COLUMN)
    comparison, compare_notes = _compare(values, metrics, per_problem, baseline, confidence, seed)
    cells = differences.attach(cells, comparison, delta=2.0)
    shown = sorted({m for m in metrics.values() if m})
    metric_text = shown[0] if len(shown) == 1 else ", ".join(f"{b} {m}" for b, m in metrics.items())
    head = f"Values: {metric_text} in %, mean ± std over seeds (ddof=1)"
    if baseline in rules and comparison is not None:
        head += f"; (+x [lo, hi]) = difference to {baseline} in points with its {confidence:.0%} interval"
    elif baseline in rules:
        head += f"; (+x) = difference to {baseline} in points"
    head += f"; {AVG_COLUMN} = mean over benchmarks." if len(benchmarks) > 1 else "."
    if BASE in rules and baseline in rules and baseline != BASE:
        head += (
            f" base: the untrained model (0 training steps, the same evaluation); its cell gives the RL gain of "
            f"{baseline} ({baseline} − base) in points"
            + (
                f" with its {confidence:.0%} interval, 'significant' (bold) where p < {1 - confidence:.2g}: the gain is"
                " a Holm family of its own (the table's check that training did anything), apart from the arms'"
                if comparison is not None
                else ""
            )
            + "."
        )
    notes = [head, *differences.method_notes(comparison, str(baseline), confidence), *compare_notes] + (
        confound_notes(values, baseline if baseline in rules else None)
        + settings_notes(final, benchmarks)
        + settings_picked
        + notes
        + duplicate_notes(values)
    )
    notes += code_notes(values, expected)
    notes += [
        f"{b}: no {metric or 'avg@n'} results."
        for b, m in metrics.items()
        if m is None or not (values["column"] == b).any()
    ]
    notes += missing_notes(final, benchmarks, expected)
    labels, problem_notes = benchmark_columns(final, benchmarks)
    caption = differences.caption(metric_text, comparison, values, baseline if baseline in rules else None, confidence)
    identical = identical_in_training(training, baseline) & set(rules) if baseline in rules else frozenset()
    if identical:
        notes.append(
            f"identical to {baseline} in training: {', '.join(sorted(identical))} (every seed's gradient norm, reward"
            f" and entropy equal {baseline}'s run of the same seed at every step: no token's update differed, so the"
            " difference is 0 by construction, not a tie measured on the data)."
        )
    table = Table(cells, rules, columns, metric_text, baseline if baseline in rules else None, notes + problem_notes)
    table.identical = frozenset(identical)
    table.column_labels = labels
    table.comparison, table.caption, table.confidence = comparison, caption, confidence
    return table


def _compare(
    values: pd.DataFrame,
    metrics: dict,
    per_problem: pd.DataFrame | None,
    baseline: str | None,
    confidence: float,
    seed: int,
) -> tuple[pd.DataFrame | None, list[str]]:
    """compare_arms over the table's avg@n columns (differences.py); refusals raise ComparisonError."""
    if baseline is None or values.empty:
        return None, []
    benchmarks = list(metrics)
    differences.check_comparable(values, baseline, benchmarks)
    comparable = [b for b, m in metrics.items() if m is not None and _AVG_METRIC.match(m)]
    notes = []
    if len(comparable) < len([m for m in metrics.values() if m]):
        notes.append("Intervals only for avg@n (c/n per problem); the other metrics have none and none is bold.")
    if not comparable:
        return None, notes
    comparison, more = differences.compare_values(
        values, per_problem, baseline, benchmarks, comparable, confidence, seed
    )
    return comparison, notes + more


def passk_table(
    df: pd.DataFrame,
    benchmark: str,
    baseline: str | None = "full",
    ks: list[int] | None = None,
    expected: pd.DataFrame | None = None,
    where: dict | None = None,
    mix_settings: bool = False,
) -> Table:
    """Rule × k table of pass@k on one benchmark (final evaluations; columns k = 1, 2, 4, ...)."""
    final, settings_picked = select_settings(_final(df)[lambda f: f["benchmark"] == benchmark], where, mix_settings)
    rows = final[(final["benchmark"] == benchmark) & final["metric"].str.match(_PASS_METRIC)]
    rows = rows.assign(column=rows["metric"].str.extract(_PASS_METRIC, expand=False).astype(int))
    columns = sorted(set(rows["column"])) if ks is None else list(ks)
    values = rows.drop_duplicates(["run", "column"], keep="last")
    arms = list(values["arm"]) + (list(_expected_arms(expected)) if expected is not None else [])
    rules = _order_rules(arms, baseline)
    cells = _aggregate(values, rules, columns, "k", baseline)
    notes = [
        f"Values: pass@k on {benchmark} in %, mean ± std over seeds (ddof=1)"
        + (f"; (+x) = difference to {baseline} in points" if baseline in rules else "")
        + "; no intervals: nothing is bold."
    ]
    notes += settings_notes(final, [benchmark]) + settings_picked + missing_notes(final, [benchmark], expected)
    notes += code_notes(values, expected)
    return Table(
        cells,
        rules,
        columns,
        f"pass@k on {benchmark}",
        baseline if baseline in rules else None,
        notes,
        column_name="k",
        column_labels={k: f"pass@{k}" for k in columns},
    )


def _expected_arms(expected: pd.DataFrame) -> pd.Series:
    key = "arm" if "arm" in expected.columns else "rule"
    return expected[key].astype(str)
