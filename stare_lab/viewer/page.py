"""`stare-lab view RUN_DIR|SWEEP.yaml [--step N] [--out FILE]`: one self-contained HTML page of a kept batch.

The page embeds its data as JSON (<script id="data" type="application/json">; docs/viewer.md lists
the fields). Per-token arrays hold the valid tokens of every rollout, row after row, as base64 of
little-endian float32 (weights, signals), int32 (token ids) or uint8 (selected): the page shows
exactly the float32 weights the rules returned. Nothing is written when the input is bad.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stare_lab.plan.run_plan import current_runs
from stare_lab.plan.schema import SweepError, load_sweep
from stare_lab.record import find_run_dirs, run_label
from stare_lab.record.kept_batch import ATTN, Batch, BatchError, kept_steps, load_run_batch, why_no_batch
from stare_lab.viewer.selection import (
    RuleView,
    apply_all_rules,
    fractions,
    one_thread,
    overlap_matrix,
    position_histogram,
    selected_fraction,
    top_tokens,
)
from stare_lab.viewer.template import CSS, HTML, SCRIPT

BINS = 20
SIGNAL_LABELS = {
    "entropy": "entropy",
    "surprisal": "surprisal (−log π)",
    "js": "JS to group mean",
    "p2": "collision prob Σp²",
}


class ViewError(ValueError):
    """Bad input to `stare-lab view`; the message is one line."""


def _b64(t: torch.Tensor, dtype) -> str:
    return base64.b64encode(np.ascontiguousarray(t.numpy().astype(dtype)).tobytes()).decode("ascii")


def _flat(t: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Values of the valid tokens, row after row (the page's token order)."""
    return t[valid]


def signal_tensors(batch: Batch) -> dict[str, tuple[str, torch.Tensor]]:
    """key -> (label, [B, T]) of the signals the page can colour by."""
    out: dict[str, tuple[str, torch.Tensor]] = {}
    if "entropy" in batch.stats:
        out["entropy"] = (SIGNAL_LABELS["entropy"], batch.stats["entropy"])
    out["surprisal"] = (SIGNAL_LABELS["surprisal"], -batch.stats["logp"])
    for key in sorted(k for k in batch.stats if k.startswith(ATTN)):
        layers = key.split("@")[1] if "@" in key else ",".join(map(str, batch.meta.get("attn_layers") or [])) or "?"
        out[key] = (f"attention entropy (layer {layers})", batch.stats[key])
    for key in ("js", "p2"):
        if key in batch.stats:
            out[key] = (SIGNAL_LABELS[key], batch.stats[key])
    passes = len(batch.updates)
    for u in batch.updates:  # the training forward's, from the loss record
        where = f"in the loss, pass {u.index + 1}" if passes > 1 else "in the loss"
        out[f"loss{u.index}:entropy"] = (f"entropy ({where})", u.entropy)
        out[f"loss{u.index}:surprisal"] = (f"surprisal ({where})", -u.logp)
    return out


def _signal_entry(key: str, label: str, values: torch.Tensor, valid: torch.Tensor) -> dict[str, Any]:
    v = _flat(values.float(), valid)
    finite = v[torch.isfinite(v)]
    lo = float(finite.min()) if finite.numel() else 0.0
    hi = float(torch.quantile(finite.double(), 0.99)) if finite.numel() else 1.0
    return {"key": key, "label": label, "values": _b64(v, "<f4"), "lo": lo, "hi": hi if hi > lo else lo + 1e-9}


def _rule_entry(view: RuleView, batch: Batch, valid: torch.Tensor) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "key": view.key,
        "name": view.name,
        "label": view.label,
        "own": view.own,
        "params": _clean(view.params),
        "computable": view.computable,
        "reason": view.reason,
    }
    if view.computed is None:
        return entry
    weights, selected = view.computed
    w = _flat(weights, valid)
    n = max(int(valid.sum()), 1)
    trained, touched = fractions(view, batch.mask) or (None, None)
    entry.update(
        {
            "normalize": view.normalize,
            "metrics": _clean(view.metrics),
            "weights": _b64(w, "<f4"),
            "selected": _b64(_flat(selected, valid), "u1"),
            "selected_frac": selected_fraction(view, batch.mask),
            "trained_frac": trained,
            "touched_frac": touched,
            "weight_mean": float(w.double().sum()) / n,
            "weight_max": float(w.max()) if w.numel() else 0.0,
            "binary": bool(((w == 0) | (w == 1)).all()),
            "positions": position_histogram(selected, batch.mask, BINS),
            "top_tokens": [list(t) for t in top_tokens(batch, selected)],
        }
    )
    if view.update is not None:  # the loss record: the rule replayed on it, micro-batch by micro-batch
        entry.update(update=view.update, reproduces_training=view.reproduces, replay_note=view.replay_note)
    elif view.own and batch.trained_weights is not None:
        entry["reproduces_training"] = bool(torch.equal(weights, batch.trained_weights.float()))
    if view.note:
        entry["note"] = view.note
    return entry


def arm_data(batch: Batch, *, label: str, run_dir: Path | str, views: list[RuleView] | None = None) -> dict[str, Any]:
    """The page's data for one batch: rollouts, token ids, signals, every rule, the overlap matrix."""
    views = apply_all_rules(batch) if views is None else views
    valid = batch.mask > 0
    lengths = batch.lengths
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist() if lengths else []
    adv = batch.advantages
    row_adv = ((adv * batch.mask).sum(1) / batch.mask.sum(1).clamp(min=1)) if adv.dim() == 2 else adv
    prompts = list(dict.fromkeys(batch.prompts))
    rollouts = [
        {
            "row": i,
            "group": int(batch.group[i]),
            "prompt": prompts.index(batch.prompts[i]),
            "reward": _num(batch.rewards[i]),
            "advantage": _num(row_adv[i]),
            "length": lengths[i],
            "offset": int(offsets[i]),
        }
        for i in range(batch.shape[0])
    ]
    keys, matrix = overlap_matrix(views)
    rule = batch.run_rule
    info = (
        f"run {Path(run_dir).name} · rule {rule['name']} · step {batch.step} · {batch.shape[0]} rollouts · "
        f"{int(valid.sum())} tokens · kept steps: {', '.join(map(str, kept_steps(run_dir))) or batch.step}"
        + loss_record_note(batch)
    )
    return {
        "label": label,
        "run_dir": str(run_dir),
        "step": batch.step,
        "info": info,
        "run_rule": rule,
        "B": batch.shape[0],
        "T": batch.shape[1],
        "rollouts": rollouts,
        "prompts": prompts,
        "vocab": {str(k): v for k, v in batch.pieces.items()},
        "byte_pieces": {str(k): [raw, list(data)] for k, (raw, data) in batch.byte_pieces.items()},
        "ids": _b64(_flat(batch.completion_ids, valid), "<i4"),
        "signals": [_signal_entry(k, lab, v, valid) for k, (lab, v) in signal_tensors(batch).items()],
        "rules": [_rule_entry(v, batch, valid) for v in views],
        "overlap": {"keys": keys, "matrix": matrix.tolist()},
    }


def loss_record_note(batch: Batch) -> str:
    """What the loss record of the batch holds, for the page's info line ("" without one)."""
    if not batch.records_loss:
        return ""
    meta = batch.loss_meta
    passes, done = int(meta.get("iterations", 1)), len(batch.updates)
    steps = sorted({s for u in batch.updates for s in u.steps})
    trained = f" (optimizer steps {', '.join(map(str, steps))})" if steps else ""
    what = "chose its tokens in the loss" if meta.get("selects_in_loss") else "changed the loss"
    return f" · the rule {what}: {done} of {passes} pass(es) over this batch recorded{trained}"


def _clean(value: Any) -> Any:
    """JSON-safe: tuples as lists, non-finite floats as the strings "inf", "-inf", "nan" (strict JSON has none)."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _num(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def write_page(arms: list[dict[str, Any]], out: Path, title: str, missing: list[dict[str, str]] | None = None) -> Path:
    """`missing`: the runs not on the page, each {"label", "run_dir", "reason"} (shown under the title).
    Each run_dir is written relative to the page's folder, and the page holds no time of writing: the
    same runs give the same bytes wherever the checkout lies."""
    out = Path(out)
    payload = {
        "title": title,
        "bins": BINS,
        "arms": [_relative_run_dir(a, out.parent) for a in arms],
        "missing": [_relative_run_dir(m, out.parent) for m in missing or []],
    }
    # "<" escaped as \u003c: the JSON can never close its <script> element
    data = json.dumps(_clean(payload), separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    html = HTML.format(title=_escape(title), css=CSS, data=data, script=SCRIPT)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out


def _relative_run_dir(entry: dict[str, Any], folder: Path) -> dict[str, Any]:
    if "run_dir" not in entry:
        return entry
    return {**entry, "run_dir": os.path.relpath(Path(entry["run_dir"]).resolve(), folder.resolve())}


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_run(run_dir: Path | str, step: int | None = None, out: Path | str | None = None) -> Path:
    """The page of `run_dir`'s kept batch at `step` (None = the last kept); default out:
    `<run_dir>/batches/step-<N>.html`. ViewError (one line) on bad input, nothing written."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ViewError(f"{run_dir} is not a directory")
    try:
        batch = load_run_batch(run_dir, step)
    except BatchError as err:
        raise ViewError(str(err)) from None
    label = run_label(run_dir)
    out = Path(out) if out else run_dir / "batches" / f"step-{batch.step}.html"
    with one_thread():
        arms = [arm_data(batch, label=label, run_dir=run_dir)]
    return write_page(arms, out, f"{label} — step {batch.step}")


def sweep_runs(sweep_yaml: Path | str, all_runs: bool = False) -> list[tuple[str, Path]]:
    """(label, run dir) of every run of a sweep's current plan, in expansion order; with `all_runs`,
    then the other run directories of its folder (runs of an earlier grid)."""
    try:
        spec = load_sweep(sweep_yaml)
        runs = current_runs(spec)
    except (SweepError, ValueError, OSError) as err:
        line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ViewError(line if line.startswith(str(sweep_yaml)) else f"{sweep_yaml}: {line}") from None
    if all_runs:
        planned = {d for _, d in runs}
        runs += [(run_label(d), d) for d in find_run_dirs(Path(spec.output) / spec.name) if d not in planned]
    return runs


def render_sweep(
    sweep_yaml: Path | str,
    step: int | None = None,
    out: Path | str | None = None,
    all_runs: bool = False,
    missing: list[dict[str, str]] | None = None,
) -> Path:
    """One page with every arm of the sweep's current plan (`all_runs`: and the other runs of its
    folder) that kept a batch at `step` (None = the last step every such run kept); default out:
    `<sweep folder>/view-step-<N>.html`. The runs without a batch at that step are named on the page
    with the reason (`batch.why_no_batch`), and appended to `missing` when a list is given."""
    runs = sweep_runs(sweep_yaml, all_runs)
    kept = {d: kept_steps(d) for _, d in runs}
    with_batches = [(lab, d) for lab, d in runs if kept[d]]
    if not with_batches:
        reasons = sorted({why_no_batch(d) for _, d in runs})
        raise ViewError(
            f"no run of sweep {sweep_yaml} has kept batches (batches/step-<N>.safetensors): "
            + ("; ".join(reasons) if len(reasons) <= 2 else f"{reasons[0]}; and {len(reasons) - 1} other reasons")
        )
    all_steps = sorted({s for _, d in with_batches for s in kept[d]})
    if step is None:
        common = set.intersection(*(set(kept[d]) for _, d in with_batches))
        step = max(common) if common else max(all_steps)
    chosen = [(lab, d) for lab, d in with_batches if step in kept[d]]
    if not chosen:
        raise ViewError(
            f"step {step} was not kept by any run of sweep {sweep_yaml}; kept steps: {', '.join(map(str, all_steps))}"
        )
    arms = []
    for lab, d in chosen:
        try:
            batch = load_run_batch(d, step)
        except BatchError as err:
            raise ViewError(str(err)) from None
        with one_thread():
            arms.append(arm_data(batch, label=lab, run_dir=d))
    absent = [
        {"label": lab, "run_dir": str(d), "reason": why_no_batch(d, step if kept[d] else None)}
        for lab, d in runs
        if (lab, d) not in chosen
    ]
    if missing is not None:
        missing.extend(absent)
    name = Path(sweep_yaml).stem
    out = Path(out) if out else chosen[0][1].parent / f"view-step-{step}.html"
    return write_page(arms, out, f"sweep {name} — step {step}", absent)


def main_view(argv: list[str] | None = None) -> int:
    """`stare-lab view RUN_DIR|SWEEP.yaml [--step N] [--out FILE]`; 0, or 2 with one error line."""
    parser = argparse.ArgumentParser(prog="stare-lab view", description="Write the token page of a kept batch.")
    parser.add_argument("target", help="a run directory or a sweep YAML")
    parser.add_argument("--step", type=int, default=None, help="kept step (default: the last kept)")
    parser.add_argument("--out", default=None, help="HTML file to write")
    parser.add_argument("--all-runs", action="store_true", help="also runs not in the sweep's current plan")
    args = parser.parse_args(argv)
    target = Path(args.target)
    missing: list[dict[str, str]] = []
    try:
        if target.suffix in (".yaml", ".yml") and target.is_file():
            path = render_sweep(target, args.step, args.out, args.all_runs, missing)
        elif target.is_dir():
            path = render_run(target, args.step, args.out)
        else:
            raise ViewError(f"{target} is neither a run directory nor a sweep YAML")
    except ViewError as err:
        print(f"stare-lab: error: {err}", file=sys.stderr)
        return 2
    for m in missing:
        print(f"stare-lab view: not on the page: {m['label']}: {m['reason']}", file=sys.stderr)
    print(path)
    return 0
