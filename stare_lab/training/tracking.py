"""Tracking: the run's own metrics log (metrics.jsonl), each row also logged to the run's W&B run
(opened by stare_lab.viewer.wandb_export.init_wandb) as a view of it.

Analysis reads metrics.jsonl (through stare_lab.record), never the W&B API.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from stare_lab.record import append_metrics, read_metrics  # noqa: F401 - read_metrics: tests/methods/test_train_rules.py
from stare_lab.training.vllm_engine import MISMATCH_WARN

# TRL's per-function reward key; the task reward is registered under the name "accuracy".
ACCURACY_KEY = "rewards/accuracy/mean"

# TRL's engine/policy mismatch metrics → their vllm/ names (kept under both; stare_lab.training.vllm_engine)
VLLM_MISMATCH = {
    "sampling/sampling_logp_difference/mean": "vllm/logp_diff_mean",
    "sampling/sampling_logp_difference/max": "vllm/logp_diff_max",
    "sampling/importance_sampling_ratio/mean": "vllm/is_ratio_mean",
    "sampling/importance_sampling_ratio/min": "vllm/is_ratio_min",
    "sampling/importance_sampling_ratio/max": "vllm/is_ratio_max",
}


# The optimizer step that generated the batch a row's step trained on (the trainer's `log`): the row's
# reward, completions/* and batch-scope rule metrics are that generation's; an int, like `step`.
GENERATION_STEP = "generation_step"


def metrics_row(step: int, logs: dict[str, Any], when: float | None = None) -> dict[str, Any]:
    """The metrics.jsonl row of one train-step log (also used to restore rows from a checkpoint)."""
    row: dict[str, Any] = {"step": step, "time": time.time() if when is None else when}
    for k, v in logs.items():
        if k.startswith("profiling/") or k == "step" or not isinstance(v, (int, float)):
            continue
        if k == GENERATION_STEP:
            row[k] = int(v)
            continue
        row[k] = float(v) if math.isfinite(float(v)) else None
    if ACCURACY_KEY in row:
        row["accuracy"] = row[ACCURACY_KEY]
    row.update({short: row[trl] for trl, short in VLLM_MISMATCH.items() if trl in row})
    return row


def mismatch_warning(row: dict[str, Any], threshold: float) -> str | None:
    """One line when a step's mean |Δ log-prob| between the engine's sampling log-probs and the training
    forward's exceeds `threshold` (checked at the first step: the two should agree; vllm_engine.MISMATCH_WARN)."""
    mean = row.get("vllm/logp_diff_mean")
    if mean is None or mean <= threshold:
        return None
    return (
        f"warning: step {row['step']}: vLLM's sampling log-probs differ from the policy's by {mean:.3g} on "
        f"average (max {row.get('vllm/logp_diff_max', float('nan')):.3g}, IS ratio mean "
        f"{row.get('vllm/is_ratio_mean', float('nan')):.3g}), above {threshold:g}: "
        "check trainer.vllm_dtype against model.dtype (docs/vllm.md)"
    )


def is_train_log(logs: dict[str, Any] | None) -> bool:
    """A train-step log: every optimizer step that logs (transformers' "loss"; "reward": rows written by
    earlier versions, which logged generation steps only), not the end-of-training summary or an evaluation."""
    if not logs:
        return False
    return ("loss" in logs or "reward" in logs) and "train_runtime" not in logs


def generated_here(row: dict[str, Any]) -> bool:
    """The row's step generated its own batch (its reward columns are not carried from an earlier step);
    True for rows without `generation_step` (records of earlier versions held generation steps only)."""
    return row.get(GENERATION_STEP, row.get("step")) == row.get("step")


class MetricsLogger(TrainerCallback):
    """Appends one row per logging step to metrics.jsonl (fsync'ed) and mirrors it to W&B: every optimizer
    step that logs, generation steps or not (the trainer's `log` carries the generation's reward columns)."""

    def __init__(self, run_dir: Path, wandb_run=None):
        self.run_dir = Path(run_dir)
        self.wandb_run = wandb_run

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not is_train_log(logs):
            return control
        row = metrics_row(state.global_step, logs)
        append_metrics(self.run_dir, row)
        if state.global_step <= args.logging_steps:  # the first logged step of the run
            warning = mismatch_warning(row, MISMATCH_WARN)
            if warning:
                print(warning, flush=True)
        if self.wandb_run is not None:
            # committed at once: evaluation points logged into the same run later get rows of their own
            self.wandb_run.log(
                {k: v for k, v in row.items() if k not in ("step", "time") and v is not None},
                step=state.global_step,
                commit=True,
            )
        return control


class StepPrinter(TrainerCallback):
    """One compact line per optimizer step (replaces transformers' dict printer)."""

    def __init__(self, label: str):
        self.label = label

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not is_train_log(logs):
            return control
        parts = [f"[{self.label}] step {state.global_step}/{state.max_steps}"]
        if isinstance(logs.get("reward"), (int, float)):
            carried = logs.get(GENERATION_STEP, state.global_step) != state.global_step
            parts.append(f"reward={logs['reward']:.3f}" + (f" (step {logs[GENERATION_STEP]}'s)" if carried else ""))
        for key, short in (("entropy", "H"), ("tokens/trained_frac", "trained"), ("tokens/touched_frac", "touched")):
            if key in logs:
                parts.append(f"{short}={logs[key]:.3f}")
        parts += [f"{k[5:]}={v:.3g}" for k, v in logs.items() if k.startswith("rule/") and isinstance(v, (int, float))][
            :3
        ]
        if "step_time" in logs:
            parts.append(f"{logs['step_time']:.2f}s/step")
        print("  ".join(parts), flush=True)
        return control
