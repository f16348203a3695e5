"""Every optimizer step is a row of the record: with several updates per generation batch
(num_iterations > 1, steps_per_generation > gradient_accumulation_steps) metrics.jsonl holds one row
per step TRL logged, with TRL's own values (loss, grad norm, clip ratios, rule metrics); the reward
columns of a step that did not generate are those of the step that generated its batch, named by
`generation_step`. Real TRL training on the tiny built-in model; the command line writes the same
rows to metrics.jsonl and to W&B."""

from __future__ import annotations

import copy
import math

import pytest
from fixtures_trainer import grpo_config, length_reward

from stare_lab.methods import get_method
from stare_lab.record import read_metrics
from stare_lab.training.learning_signal import no_signal_warning
from stare_lab.training.tracking import GENERATION_STEP, MetricsLogger, is_train_log
from stare_lab.training.trainer import TokenRuleGRPOTrainer

# what TRL and the rule log at generation (carried to the steps that train on the batch without generating)
GENERATION_KEYS = ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "num_tokens")
# what TRL and the trainer log in every loss call (each step's own)
LOSS_KEYS = ("loss", "grad_norm", "learning_rate", "entropy", "clip_ratio/region_mean", "tokens/trained_frac")


def _train(tiny_arithmetic, tmp_path, rule="full", **kw):
    tok, model, task = tiny_arithmetic
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer = TokenRuleGRPOTrainer(
        model=copy.deepcopy(model),
        reward_funcs=[length_reward],
        args=grpo_config(tmp_path, **{"gradient_accumulation_steps": 2, "learning_rate": 3e-2, **kw}),
        train_dataset=task.train_dataset(),
        processing_class=tok,
        rule=get_method(rule),
        callbacks=[MetricsLogger(run_dir)],
    )
    trainer.train()
    return trainer, read_metrics(run_dir)


def _expected_generation_steps(max_steps: int, accumulation: int, per_generation: int, iterations: int) -> list[int]:
    """TRL generates at micro-batch k when k % (steps_per_generation · num_iterations) == 0; step s (1-based)
    runs micro-batches (s−1)·accumulation … s·accumulation − 1; a step trains on the last batch generated."""
    every = per_generation * iterations
    out, last = [], None
    for s in range(1, max_steps + 1):
        if any(k % every == 0 for k in range((s - 1) * accumulation, s * accumulation)):
            last = s
        out.append(last)
    return out


@pytest.mark.parametrize(
    ("rule", "accumulation", "per_generation", "iterations"),
    [
        ("full", 2, 2, 1),  # one update per generation: every step generates
        ("full", 2, 2, 2),  # num_iterations 2: every other step trains the batch again
        ("kl_cov", 2, 2, 4),  # num_iterations 4 (KL-Cov acts from the second update on)
        ("full", 2, 4, 1),  # steps_per_generation 4 > accumulation 2: the set-up
        ("top_entropy", 1, 2, 2),  # a batch-scope rule: its metrics are the generation's, carried
    ],
)
def test_every_step_is_a_row_with_trls_values(
    tiny_arithmetic, tmp_path, rule, accumulation, per_generation, iterations
):
    steps = 4
    trainer, rows = _train(
        tiny_arithmetic,
        tmp_path,
        rule,
        max_steps=steps,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=per_generation,
        num_iterations=iterations,
    )
    history = [e for e in trainer.state.log_history if is_train_log(e)]
    assert len(trainer.state.log_history) == steps + 1  # every step, then the end-of-training summary
    assert [r["step"] for r in rows] == [e["step"] for e in history] == list(range(1, steps + 1))
    generation = _expected_generation_steps(steps, accumulation, per_generation, iterations)
    assert [r[GENERATION_STEP] for r in rows] == generation
    assert all(isinstance(r[GENERATION_STEP], int) for r in rows)
    by_step = {r["step"]: r for r in rows}
    for row, logged in zip(rows, history, strict=True):
        for key, value in logged.items():  # every value TRL logged is in the row, unchanged
            if key == "step":
                continue
            expected = None if not math.isfinite(float(value)) else float(value)
            assert row[key] == expected, (row["step"], key)
        assert set(row) - set(logged) == {"time"}
        for key in LOSS_KEYS:  # the step's own values
            assert isinstance(row[key], float), (row["step"], key)
        source = by_step[row[GENERATION_STEP]]
        for key in GENERATION_KEYS:  # the generation's values
            assert row[key] == source[key], (row["step"], key)
        if rule == "top_entropy":
            for key in ("tokens/selected_frac", "tokens/weight_mean", "rule/entropy_kept_mean"):
                assert row[key] == source[key]
    # the loss is each step's own: a carried row is not a copy of its generation row
    carried = [r for r in rows if r[GENERATION_STEP] != r["step"]]
    assert len(carried) == steps - len(set(generation))
    for row in carried:
        assert (
            row["loss"] != by_step[row[GENERATION_STEP]]["loss"]
            or row["grad_norm"] != (by_step[row[GENERATION_STEP]]["grad_norm"])
        )
    if rule == "kl_cov":  # a rule that selects in the loss logs its metrics at every step, not carried
        for r in rows:  # the same share of the same tokens: the rule's in float64, the trainer's in float32
            assert 0 < r["tokens/touched_frac"] == pytest.approx(r["rule/penalised_frac"], rel=1e-6)
        assert all(r["tokens/trained_frac"] == 1.0 for r in rows)


def test_the_learning_signal_check_counts_each_generation_once():
    """A generation without signal, carried to three more steps, is one of two generations, not four of five."""
    rows = [
        {"step": 1, "loss": 0.1, "reward": 0.0, "frac_reward_zero_std": 1.0, GENERATION_STEP: 1},
        *({"step": s, "loss": 0.1, "reward": 0.0, "frac_reward_zero_std": 1.0, GENERATION_STEP: 1} for s in (2, 3, 4)),
        {"step": 5, "loss": 0.1, "reward": 0.5, "frac_reward_zero_std": 0.0, GENERATION_STEP: 5},
    ]
    assert no_signal_warning(rows, "x") is None  # 1 of 2: exactly half
    rows.append({"step": 6, "loss": 0.1, "reward": 0.0, "frac_reward_zero_std": 1.0, GENERATION_STEP: 6})
    line = no_signal_warning(rows, "x")
    assert line is not None and "no learning signal in 2 of 3 steps" in line
    # the end-of-training summary and evaluation logs are not steps
    assert not is_train_log({"train_runtime": 1.0, "train_loss": 0.1, "reward": 0.0})
    assert not is_train_log({"eval_loss": 0.1, "eval_reward": 0.0})
    assert is_train_log({"loss": 0.1, "grad_norm": 0.2}) and is_train_log({"reward": 0.0})


def test_the_command_line_records_every_step_in_metrics_and_wandb(tmp_path, capfd):
    """`stare-lab train` with steps_per_generation 4 over 4 steps: rows 1–4 in metrics.jsonl and W&B (the
    issue saw steps 1 and 3 only), the step lines say whose reward a step shows."""
    from wandb_files import history_by_step, wandb_records

    from stare_lab.cli import main

    run = tmp_path / "run"
    argv = [
        "train",
        "method=full",
        "trainer.max_steps=4",
        "trainer.per_device_train_batch_size=8",
        "trainer.num_generations=4",
        "trainer.gradient_accumulation_steps=2",
        "trainer.steps_per_generation=4",
        "logger=wandb_offline",
        "eval.enabled=false",
        f"run_dir={run}",
    ]
    assert main(argv) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r[GENERATION_STEP] for r in rows] == [1, 1, 3, 3]
    assert rows[1]["reward"] == rows[0]["reward"] and rows[3]["reward"] == rows[2]["reward"]
    assert all(isinstance(r["grad_norm"], float) and isinstance(r["clip_ratio/region_mean"], float) for r in rows)
    (folder,) = (run / "wandb").glob("offline-run-*")
    history = history_by_step(wandb_records(folder))
    assert sorted(history) == [1, 2, 3, 4]
    for row in rows:
        for key in ("loss", "grad_norm", "reward", GENERATION_STEP, "tokens/trained_frac"):
            assert history[row["step"]][key] == pytest.approx(row[key], rel=1e-12), (row["step"], key)
    out = capfd.readouterr().out
    assert "step 2/4" in out and "reward=" in out and "(step 1's)" in out
