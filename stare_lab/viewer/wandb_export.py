"""W&B as a view of the run record: evaluation results, the token page and figures, the sweep summary.

Each function writes into an open W&B run when given one (a run's own, kept open by the runner from
training through evaluation, opened by `init_wandb` below), else resumes (or starts) one with the same
settings (same project, group = sweep, id = the run id, offline unless WANDB_API_KEY is set, so a
resumed run continues the same W&B run), writes, and finishes it.
Analysis never reads W&B back (it reads the run records); the tests do, from the offline files.

Keys
- run summary, per benchmark of the final evaluation: `eval/<benchmark>/<metric>` (avg@n, pass@k,
  maj@n, fractions), `eval/<benchmark>/<metric>_ci_lo|_ci_hi` (bootstrap interval), and
  `eval/<benchmark>/settings` (n, temperature, top_p, max_tokens, verifier, num_problems, step).
- run history, every evaluation (intermediate checkpoints, then the final one) as a point of the
  same keys against `eval/step` (a W&B step metric: a resumed run may not log below its last step).
- token page: `tokens/page` (wandb.Html), `tokens/<figure stem>` (wandb.Image), `tokens/overlap`
  (wandb.Table, the page's Jaccard matrix), summary `tokens/selected_frac/<rule>`,
  `tokens/trained_frac/<rule>`, `tokens/touched_frac/<rule>` and `tokens/step`.
- sweep summary run (id `summary-<hash of the sweep name>`, group = the sweep, job_type "summary"):
  `table` (wandb.Table of the finished table), summary `table/<rule>/<column>` (mean over seeds),
  `passk/<benchmark>` (line series of pass@k against k per rule), summary
  `passk/<benchmark>/<rule>/pass@<k>`, and any figure as `figures/<stem>` (wandb.Image); where the
  table has intervals (compare_arms), `comparison` (wandb.Table: rule, column, delta, ci_lo, ci_hi,
  p_value, p_holm, verdict, seeds; points) and summary `compare/<rule>/<column>/<delta|ci_lo|ci_hi|
  p_value|p_holm|verdict>`, the same numbers as the printed table.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast, get_args

from omegaconf import OmegaConf

from stare_lab.config.run_config import load_config
from stare_lab.record import CONFIG_FILE, RESULT_SETTINGS, read_eval_results, result_setting
from stare_lab.record.kept_batch import kept_steps

SETTINGS = (*RESULT_SETTINGS, "step")
COMPARISON_FIELDS = ("delta", "ci_lo", "ci_hi", "p_value", "p_holm", "verdict", "seeds")


WandbMode = Literal["online", "offline", "disabled"]


def wandb_mode(mode: str) -> WandbMode:
    """W&B's mode for `logger.mode` (the config allows auto, online, offline, disabled): "auto" is online
    when WANDB_API_KEY is set, else offline."""
    if mode == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    for known in get_args(WandbMode):
        if mode == known:
            return known
    raise ValueError(f"logger.mode: {mode!r} is not one of auto, {', '.join(get_args(WandbMode))}")


def init_wandb(cfg, run_dir: Path):
    """Start (or resume) the W&B run of this run dir; None when W&B is off."""
    if not cfg.logger.wandb or wandb_mode(cfg.logger.mode) == "disabled":
        return None
    import wandb  # deferred: wandb, only when W&B is on

    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb.init(
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        group=cfg.run.sweep,
        name=cfg.run.label or cfg.run.id,
        tags=[cfg.method.name, f"seed={cfg.seed}"],
        # cast: omegaconf types to_container's result for any container; a DictConfig gives a str-keyed dict
        config=cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True)),
        id=cfg.run.id,
        resume="allow",
        dir=str(run_dir),
        mode=wandb_mode(cfg.logger.mode),
        settings=wandb.Settings(console="off", x_disable_stats=True),
    )


def _open_run(run_dir: Path):
    return init_wandb(load_config(Path(run_dir) / CONFIG_FILE), Path(run_dir))


def eval_items(result: dict[str, Any]) -> dict[str, float]:
    """{`eval/<benchmark>/<metric>`: value} of one evaluation result (eval/<benchmark>.json)."""
    bench = result["benchmark"]
    out: dict[str, float] = {}
    for metric, value in (result.get("metrics") or {}).items():
        if isinstance(value, (list, tuple)) and len(value) == 2:
            out[f"eval/{bench}/{metric}_lo"], out[f"eval/{bench}/{metric}_hi"] = float(value[0]), float(value[1])
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[f"eval/{bench}/{metric}"] = float(value)
    return out


def log_eval(run_dir: Path | str, results: list[dict[str, Any]] | None = None, run=None) -> dict[str, Any] | None:
    """Put a run's evaluation into its W&B run: points for every evaluation, the final one in the summary.

    results: evaluation results as `stare_lab.record.read_eval_results(run_dir)` gives them (dicts of
    eval/<benchmark>.json plus `final` and `step`); None reads them. Returns the summary entries
    written, or None when the run has W&B off or no evaluation. `run`: an open W&B run to log
    into (left open); None opens the run's own and finishes it.
    """
    if results is None:
        results = read_eval_results(run_dir)
    if not results:
        return None
    owned = run is None
    run = _open_run(Path(run_dir)) if owned else run
    if run is None:
        return None
    summary: dict[str, Any] = {}
    try:
        run.define_metric("eval/step")
        run.define_metric("eval/*", step_metric="eval/step")
        ordered = sorted(results, key=lambda r: (bool(r.get("final")), r.get("step") or 0))
        for r in ordered:
            run.log({"eval/step": int(r.get("step") or 0), **eval_items(r)})
        for r in ordered:
            if r.get("final"):
                summary.update(eval_items(r))
                summary[f"eval/{r['benchmark']}/settings"] = {k: result_setting(r, k) for k in SETTINGS}
        run.summary.update(summary)
    finally:
        if owned:
            run.finish()
    return summary


def page_summary(page: Path | str) -> dict[str, Any]:
    """What the token page shows, read from its embedded data: {`tokens/selected_frac/<rule>`,
    `tokens/trained_frac/<rule>`, `tokens/touched_frac/<rule>`, `tokens/step`}."""
    arm = page_data(page)["arms"][0]
    out: dict[str, Any] = {"tokens/step": arm["step"]}
    for r in arm["rules"]:
        if r["computable"]:
            for key in ("selected_frac", "trained_frac", "touched_frac"):
                if r.get(key) is not None:  # pages written before the trained and touched fractions lack them
                    out[f"tokens/{key}/{r['key']}"] = r[key]
    return out


def page_data(page: Path | str) -> dict[str, Any]:
    html = Path(page).read_text(encoding="utf-8")
    return json.loads(html.split('<script id="data" type="application/json">', 1)[1].split("</script>", 1)[0])


def log_token_page(
    run_dir: Path | str, page: Path | str, figures: Sequence[Path | str] = (), run=None
) -> dict[str, Any] | None:
    """Log the token page (wandb.Html), the selection figures (wandb.Image) and the page's selected
    fractions and overlap matrix into the run's W&B record. Returns the summary entries, or None.
    `run`: an open W&B run to log into (left open); None opens the run's own and finishes it."""
    import wandb  # deferred: wandb (~0.5 s), only when a run logs to it

    owned = run is None
    run = _open_run(Path(run_dir)) if owned else run
    if run is None:
        return None
    summary = page_summary(page)
    overlap = page_data(page)["arms"][0]["overlap"]
    try:
        run.define_metric("tokens/step")
        run.define_metric("tokens/*", step_metric="tokens/step")
        table = wandb.Table(
            columns=["rule", *overlap["keys"]],
            data=[[k, *row] for k, row in zip(overlap["keys"], overlap["matrix"], strict=True)],
        )
        media: dict[str, Any] = {
            "tokens/step": summary["tokens/step"],
            "tokens/overlap": table,
            "tokens/page": wandb.Html(Path(page).read_text(encoding="utf-8"), inject=False),
        }
        for fig in figures:
            media[f"tokens/{Path(fig).stem}"] = wandb.Image(str(fig))
        run.log(media)
        run.summary.update(summary)
    finally:
        if owned:
            run.finish()
    return summary


def publish_run(run_dir: Path | str, run=None) -> dict[str, Any] | None:
    """After a run's evaluation, into its W&B run: the evaluation results and, when it kept
    generation batches, its token page (last kept step) with the selection figures (written to
    <run_dir>/figures/). `run`: the run's open W&B run (the runner keeps the training run open
    for this; left open); None resumes the run's own and finishes it. None when W&B is off or
    there is nothing to log."""
    run_dir = Path(run_dir)
    results, kept = read_eval_results(run_dir), kept_steps(run_dir)
    if not results and not kept:
        return None
    owned = run is None
    run = _open_run(run_dir) if owned else run
    if run is None:
        return None
    summary: dict[str, Any] = {}
    try:
        summary.update(log_eval(run_dir, results, run=run) or {})
        if kept:
            from stare_lab.viewer.figures import plot_selection  # deferred: matplotlib, only a run that kept batches
            from stare_lab.viewer.page import render_run  # deferred: torch (the page reads the kept batches)

            page = render_run(run_dir)
            summary.update(log_token_page(run_dir, page, plot_selection(run_dir, run_dir / "figures"), run=run) or {})
    finally:
        if owned:
            run.finish()
    return summary


def summary_run_id(sweep: str) -> str:
    return "summary-" + hashlib.sha256(sweep.encode()).hexdigest()[:12]


def log_sweep_summary(
    sweep: str,
    table,
    passk: dict[str, Any] | None = None,
    figures: Sequence[Path | str] = (),
    *,
    out_dir: Path | str,
    project: str = "stare_lab",
    entity: str | None = None,
    mode: str = "auto",
) -> dict[str, Any]:
    """One W&B run in the sweep's group with the finished table and the pass@k curves.

    table: a `stare_lab.analysis.tables.Table` (results_table); passk: {benchmark: passk_table(...)};
    figures: PNGs (e.g. analysis.plots.plot_passk's) logged as images. The run id is fixed by the
    sweep name, so `stare-lab table --wandb` again resumes the same summary run. Returns the summary.
    """
    import wandb  # deferred: as in log_token_page

    os.environ.setdefault("WANDB_SILENT", "true")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=project,
        entity=entity,
        group=sweep,
        name=f"{sweep} summary",
        job_type="summary",
        id=summary_run_id(sweep),
        resume="allow",
        dir=str(out_dir),
        mode=wandb_mode(mode),
        config={"sweep": sweep, "metric": table.metric},
        tags=["summary"],
        settings=wandb.Settings(console="off", x_disable_stats=True),
    )
    summary: dict[str, Any] = {"table/metric": table.metric}
    try:
        means, stds = table.pivot("mean"), table.pivot("std")
        rows = [[rule, *[_cell(means.loc[rule, c], stds.loc[rule, c]) for c in table.columns]] for rule in table.rules]
        log: dict[str, Any] = {"table": wandb.Table(columns=["rule", *map(str, table.columns)], data=rows)}
        for rule in table.rules:
            for c in table.columns:
                if _finite(means.loc[rule, c]):
                    summary[f"table/{rule}/{c}"] = float(means.loc[rule, c])
        for bench, pk in (passk or {}).items():
            m = pk.pivot("mean")
            ks = [int(k) for k in pk.columns]
            shown = [r for r in pk.rules if any(_finite(m.loc[r, k]) for k in pk.columns)]
            log[f"passk/{bench}"] = wandb.plot.line_series(
                xs=ks,
                ys=[[float(m.loc[r, k]) for k in pk.columns] for r in shown],
                keys=shown,
                title=f"pass@k on {bench}",
                xname="k",
            )
            for r in shown:
                for k in pk.columns:
                    if _finite(m.loc[r, k]):
                        summary[f"passk/{bench}/{r}/pass@{int(k)}"] = float(m.loc[r, k])
        comparison = getattr(table, "comparison", None)
        if comparison is not None and not comparison.empty:
            log["comparison"], found = comparison_items(comparison, wandb.Table)
            summary.update(found)
        for fig in figures:
            log[f"figures/{Path(fig).stem}"] = wandb.Image(str(fig))
        run.log(log)
        run.summary.update(summary)
    finally:
        run.finish()
    return summary


def comparison_items(comparison, table_type) -> tuple[Any, dict[str, Any]]:
    """compare_arms' frame → (a wandb.Table of it, summary `compare/<rule>/<column>/<field>`)."""
    summary: dict[str, Any] = {}
    rows = []
    for r in comparison.to_dict("records"):
        values = [r[f] for f in COMPARISON_FIELDS]
        rows.append([str(r["arm"]), str(r["benchmark"]), *[_plain(v) for v in values]])
        for f, v in zip(COMPARISON_FIELDS, values, strict=True):
            if f != "seeds" and (isinstance(v, str) or _finite(v)):
                summary[f"compare/{r['arm']}/{r['benchmark']}/{f}"] = _plain(v)
    return table_type(columns=["rule", "column", *COMPARISON_FIELDS], data=rows), summary


def _plain(v):
    """A JSON-able scalar: str as is, numbers as float (NaN as None)."""
    if isinstance(v, str):
        return v
    return float(v) if _finite(v) else None


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _cell(mean, std) -> str:
    if not _finite(mean):
        return "–"
    return f"{100 * float(mean):.1f}" + (f" ± {100 * float(std):.1f}" if _finite(std) else "")
