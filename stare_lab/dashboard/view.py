"""The sweep's W&B workspace (`wandb_workspaces.workspaces.Workspace`), built from what its runs logged.

Every panel is on keys that at least one run of the sweep logged (stare_lab.dashboard.logged): a
line plot on a history key, a bar chart on a summary key, a media panel on a logged media key, a
table panel on a logged table, a custom chart on a logged `wandb.plot` chart. Sections, in order:

- training metrics by theme (reward and accuracy, entropy, selected and trained tokens, clipping,
  response length, optimisation, vLLM), each key a line plot against the training step;
- `Rule: <name>`: the `rule/...` keys that rule's runs logged (only rules that log them);
- `Evaluation: <benchmark>`: avg@n, pass@k and maj@n of the final evaluation as bar charts, and
  avg@n against `eval/step` when runs evaluated more than once;
- `Token page`: the token page (html), its selection figures and the rules' overlap table;
- `Sweep results`: what `stare-lab table --wandb` logs into the sweep's summary run (the
  comparison table, the forest plot, pass@k curves, the results table);
- `Other metrics`: every other numeric history key, closed.

Runs are filtered to the sweep's W&B group and grouped by rule (`method.name`, then `run.variant`
and any config key that splits arms the way stare_lab.record.frames does); panels draw the mean
over a group's seeds with the min-max band. Panel ids are derived from their content, so building
the same view twice gives the same specification.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws

from stare_lab.dashboard.logged import LoggedRun
from stare_lab.record.arms import flatten, rule_label, splits_arm

# (section, [(key or compiled pattern, title or None)]); a history key goes to the first section that names it
TRAINING: tuple[tuple[str, list[tuple[str | re.Pattern[str], str | None]]], ...] = (
    (
        "Reward and accuracy",
        [
            ("reward", "reward (mean over the batch)"),
            ("accuracy", "accuracy (training batch)"),
            ("reward_std", "reward std"),
            ("frac_reward_zero_std", "groups whose rewards are all equal"),
        ],
    ),
    (
        "Entropy",
        [
            ("entropy", "entropy, all tokens"),
            ("tokens/entropy_selected", "entropy, selected tokens"),
            ("tokens/rollout_entropy", "entropy of the sampled tokens"),
        ],
    ),
    (
        "Selected and trained tokens",
        [
            ("tokens/selected_frac", "selected fraction of tokens"),
            ("tokens/trained_frac", "trained fraction of tokens"),
            ("tokens/touched_frac", "touched fraction of tokens"),
            ("tokens/weight_mean", "token weight, mean"),
            ("tokens/weight_std", "token weight, std"),
            (re.compile(r"^tokens/(?!step$)"), None),
        ],
    ),
    ("Clipping", [(re.compile(r"^clip_ratio/"), None)]),
    (
        "Response length",
        [
            ("completions/mean_length", "response length (mean tokens)"),
            ("completions/clipped_ratio", "responses cut at the length limit"),
            (re.compile(r"^completions/"), None),
        ],
    ),
    (
        "Optimisation",
        [("loss", None), ("grad_norm", None), ("learning_rate", None), ("step_time", "seconds per step")],
    ),
    ("vLLM", [(re.compile(r"^vllm/"), None)]),
)
CLOSED = {"Optimisation", "vLLM", "Other metrics"}
SKIP = re.compile(r"^(eval/|rule/|tokens/step$)")  # eval: its own section; rule/: per rule; tokens/step: a step metric
EVAL_KEY = re.compile(r"^eval/(?P<bench>.+)/(?P<metric>[^/.]+)$")  # not eval/<bench>/settings.<field>
EVAL_ORDER = (("avg@", 0), ("pass@", 1), ("maj@", 2))
SUMMARY_RUN = "summary"  # job_type of `stare-lab table --wandb`'s run (viewer.wandb_export.log_sweep_summary)


def build_workspace(
    sweep: str, runs: list[LoggedRun], entity: str, project: str, name: str | None = None
) -> ws.Workspace:
    """The workspace of `sweep` from its logged runs (training runs and the summary run alike)."""
    training = [r for r in runs if r.job_type != SUMMARY_RUN]
    summary = [r for r in runs if r.job_type == SUMMARY_RUN]
    themed, placed = _training_sections(training)
    sections = [
        *themed,
        *_rule_sections(training),
        *_eval_sections(training),
        *_token_sections(training),
        *_summary_sections(summary),
        *_other_sections(training, placed),
    ]
    return ws.Workspace(
        entity=entity,
        project=project,
        name=name or f"{sweep} (stare-lab)",
        sections=sections,
        settings=ws.WorkspaceSettings(x_axis="Step", max_runs=max(10, len(runs) + 1)),
        runset_settings=ws.RunsetSettings(
            filters=[ws.Metric("Group") == sweep],
            groupby=[ws.Config(k) for k in grouping_keys(training)],
        ),
    )


def grouping_keys(runs: Iterable[LoggedRun]) -> list[str]:
    """Config keys the runs are grouped by: `method.name`; `run.variant` where a run has one; then the
    keys that differ between runs of one rule label, other than seeds, run/logger keys and paths
    (stare_lab.record.frames's arms)."""
    configs = [flatten(r.config) for r in runs]
    keys = ["method.name"]
    if any(c.get("run.variant") not in (None, "") for c in configs):
        keys.append("run.variant")
    arms: dict[str, list[dict[str, Any]]] = {}
    for c in configs:
        arms.setdefault(rule_label(str(c.get("method.name")), c.get("run.variant")), []).append(c)
    for members in arms.values():
        for k in sorted({k for c in members for k in c}):
            if k not in keys and splits_arm(k) and len({repr(c.get(k)) for c in members}) > 1:
                keys.append(k)
    return keys


def _line(title: str | None, key: str, x: str = "Step") -> wr.LinePlot:
    # seeds: the mean over a group's runs and its min-max band
    panel = wr.LinePlot(title=title or key, x=x, y=[key], groupby_aggfunc="mean", groupby_rangefunc="minmax")
    return _stable(panel, "line", x, key, title or "")


def _bar(title: str, key: str) -> wr.BarPlot:
    panel = wr.BarPlot(title=title, metrics=[key], groupby_aggfunc="mean", groupby_rangefunc="minmax")
    return _stable(panel, "bar", key)


def _section(name: str, panels: list[Any], columns: int = 3) -> ws.Section:
    return ws.Section(
        name=name,
        panels=panels,
        is_open=name not in CLOSED,
        layout_settings=ws.SectionLayoutSettings(columns=columns, rows=2),
    )


def _history_keys(runs: list[LoggedRun]) -> list[str]:
    return sorted({k for r in runs for k in r.history})


def _training_sections(runs: list[LoggedRun]) -> tuple[list[ws.Section], set[str]]:
    """The themed sections and the keys they hold."""
    keys = [k for k in _history_keys(runs) if not SKIP.match(k)]
    placed: set[str] = set()
    sections = []
    for name, entries in TRAINING:
        panels = []
        for pattern, title in entries:
            for key in keys:
                if key not in placed and (key == pattern if isinstance(pattern, str) else pattern.match(key)):
                    placed.add(key)
                    panels.append(_line(title, key))
        if panels:
            sections.append(_section(name, panels))
    return sections, placed


def _rule_sections(runs: list[LoggedRun]) -> list[ws.Section]:
    """One section per rule whose runs logged `rule/...` keys, holding only the keys of that rule's runs."""
    by_rule: dict[str, set[str]] = {}
    for r in runs:
        by_rule.setdefault(str(r.rule), set()).update(k for k in r.history if k.startswith("rule/"))
    return [
        _section(f"Rule: {rule}", [_line(f"{key} ({rule})", key) for key in sorted(keys)])
        for rule, keys in sorted(by_rule.items())
        if keys
    ]


def _eval_sections(runs: list[LoggedRun]) -> list[ws.Section]:
    benches: dict[str, set[str]] = {}
    for r in runs:
        for key in r.summary:
            found = EVAL_KEY.match(key)
            if found and not found["metric"].endswith(("_lo", "_hi")):
                benches.setdefault(found["bench"], set()).add(found["metric"])
    repeated = any(r.eval_points > 1 for r in runs)
    sections = []
    for bench, metrics in sorted(benches.items()):
        panels: list[Any] = [_bar(f"{bench}: {m}", f"eval/{bench}/{m}") for m in sorted(metrics, key=_eval_rank)]
        if repeated:
            for m in sorted(metrics, key=_eval_rank):
                key = f"eval/{bench}/{m}"
                if m.startswith("avg@") and any(key in r.history for r in runs):
                    panels.append(_line(f"{bench}: {m} during training", key, x="eval/step"))
        sections.append(_section(f"Evaluation: {bench}", panels, columns=4))
    return sections


def _eval_rank(metric: str) -> tuple[int, int, str]:
    for prefix, rank in EVAL_ORDER:
        if metric.startswith(prefix) and metric[len(prefix) :].isdigit():
            return rank, int(metric[len(prefix) :]), metric
    return len(EVAL_ORDER), 0, metric


def _media_keys(runs: list[LoggedRun], kind: str, pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return sorted({k for r in runs for k, t in r.media.items() if t == kind and rx.match(k)})


def _token_sections(runs: list[LoggedRun]) -> list[ws.Section]:
    panels: list[Any] = []
    for key in _media_keys(runs, "html-file", r"^tokens/"):
        panels.append(_stable(wr.MediaBrowser(title="token page (last kept step)", media_keys=[key]), "media", key))
    figures = _media_keys(runs, "image-file", r"^tokens/")
    if figures:
        panels.append(_stable(wr.MediaBrowser(title="selection figures", media_keys=figures), "media", *figures))
    for key in _media_keys(runs, "table-file", r"^tokens/"):
        panels.append(_stable(wr.WeavePanelSummaryTable(table_name=key), "table", key))
    return [_section("Token page", panels, columns=2)] if panels else []


def _summary_sections(runs: list[LoggedRun]) -> list[ws.Section]:
    """`stare-lab table --wandb`'s run: the comparison table and the forest plot first."""
    panels: list[Any] = []
    tables = _media_keys(runs, "table-file", r"^(comparison|table)$")
    for name in sorted(tables):  # comparison, then table
        panels.append(_stable(wr.WeavePanelSummaryTable(table_name=name), "table", name))
    forest = _media_keys(runs, "image-file", r"^figures/forest")
    if forest:
        panels.append(_stable(wr.MediaBrowser(title="forest plot", media_keys=forest), "media", *forest))
    for r in runs:
        for key, chart in sorted(r.charts.items()):
            panels.append(_chart(key, chart))
    others = [k for k in _media_keys(runs, "image-file", r"^figures/") if k not in forest]
    if others:
        panels.append(_stable(wr.MediaBrowser(title="figures", media_keys=others), "media", *others))
    return [_section("Sweep results", panels, columns=2)] if panels else []


def _chart(key: str, chart: dict[str, Any]) -> wr.CustomChart:
    """A logged `wandb.plot` chart (its `_wandb.visualize.<key>` config) as a custom chart panel."""
    table = next(
        (
            arg["value"]
            for q in chart.get("userQuery", {}).get("queryFields", [])
            for f in q.get("fields", [])
            for arg in f.get("args", []) or []
            if arg.get("name") == "tableKey"
        ),
        f"{key}_table",
    )
    panel = wr.CustomChart(
        query={"summaryTable": {"tableKey": table}},
        chart_name=chart.get("panelDefId", ""),
        chart_fields=chart.get("fieldSettings", {}),
        chart_strings=chart.get("stringSettings", {}),
    )
    return _stable(panel, "chart", key, table)


def _other_sections(runs: list[LoggedRun], placed: set[str]) -> list[ws.Section]:
    rest = [k for k in _history_keys(runs) if not SKIP.match(k) and k not in placed]
    return [_section("Other metrics", [_line(None, k) for k in rest])] if rest else []


def _stable(panel: Any, *parts: str) -> Any:
    """Give the panel an id derived from what it shows (the library draws a random one)."""
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()
    object.__setattr__(panel, "_id", format(int(digest[:16], 16), "x")[:11])
    return panel
