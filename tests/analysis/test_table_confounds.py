"""Issue 26.6: a table names the settings besides the rule in which its arms differ, read from the runs' records.

At their default scope clip_cov and kl_cov aggregate the loss per micro-batch (verl's token mean) while `full`
aggregates with TRL's loss type, so "clip_cov +1.1 [+0.5, +1.7]" may be partly the averaging. The table says so
under it, with each value's arms, and names the matched control (the baseline's rule at the other setting) where
the table has one. The fixture's rules stand in for the field's: what counts is each run's config.yaml.
"""

from __future__ import annotations

from pathlib import Path

import fixtures_runs as fx

from stare_lab.analysis import collect_problems, collect_runs, results_table
from stare_lab.analysis.notes import arm_settings

TRAINER = {
    "trainer.loss_type": "dapo",
    "trainer.microbatch_aggregation": "verl",
    "trainer.num_iterations": 1,
    "trainer.steps_per_generation": 2,
    "trainer.save_steps": 10,
    "trainer.use_vllm": False,
    "trainer.vllm_gpu_memory_utilization": 0.3,
}


def write(root: Path, arms: dict[tuple[str, str | None], dict], seeds: int = 2) -> Path:
    for (method, variant), config in arms.items():
        for seed in range(1, seeds + 1):
            extra = {**TRAINER, "method.params.scope": "batch", **config}
            fx.write_run(root, method, variant, seed, evals={"aime24": 0.5 + 0.01 * seed}, extra_config=extra)
    return root / fx.SWEEP


def notes_of(root: Path, baseline: str = "full") -> list[str]:
    t = results_table(collect_runs(root), baseline=baseline, per_problem=collect_problems(root))
    return [n for n in t.notes if n.startswith("Arms differ in more than their rule")]


def test_aggregation_scope_and_updates_that_differ_are_named_with_their_arms(tmp_path):
    root = write(
        tmp_path,
        {
            ("full", None): {},
            ("stare", None): {"method.params.scope": "microbatch"},  # as clip_cov / kl_cov at their default
            ("ict", None): {"trainer.num_iterations": 2, "trainer.save_steps": 50},  # as Lopti; save_steps: no
            ("rsi_band", "[0.5,1]"): {"trainer.vllm_gpu_memory_utilization": 0.5},  # vLLM off: not a setting
        },
    )
    (note,) = notes_of(root)
    assert note == (
        "Arms differ in more than their rule (from each run's config.yaml): "
        "loss aggregation: TRL's dapo (full, ict, rsi_band[0.5,1]), verl's token mean per micro-batch (stare); "
        "method.params.scope: batch (full, ict, rsi_band[0.5,1]), microbatch (stare); "
        "trainer.num_iterations: 1 (full, rsi_band[0.5,1], stare), 2 (ict). "
        "A difference to full then mixes the rule with these settings; compare an arm with a matched control "
        "(the baseline's rule at the arm's setting; docs/sweeps.md, \"Matched controls\")."
    )
    # the note stands under the table, in markdown and LaTeX
    t = results_table(collect_runs(root), per_problem=collect_problems(root))
    assert note in t.to_markdown() and "Arms differ in more than their rule" in t.to_latex()


def test_the_matched_control_in_the_table_is_named(tmp_path):
    """full[mb] is full aggregated per micro-batch (sweeps/field.yaml's grpo_microbatch): the control of stare."""
    root = write(
        tmp_path,
        {
            ("full", None): {},
            ("full", "[mb]"): {"method.params.scope": "microbatch"},
            ("stare", None): {"method.params.scope": "microbatch"},
        },
    )
    (note,) = notes_of(root)
    assert "verl's token mean per micro-batch (full[mb], stare; matched control: full[mb])" in note
    assert note.endswith("compare each such arm with its matched control named here.")


def test_trl_aggregation_at_microbatch_scope_is_trls_loss_type(tmp_path):
    """trainer.microbatch_aggregation: trl makes a micro-batch rule aggregate as full does: no aggregation
    difference; the scope still differs."""
    root = write(
        tmp_path,
        {
            ("full", None): {},
            ("stare", None): {"method.params.scope": "microbatch", "trainer.microbatch_aggregation": "trl"},
        },
    )
    (note,) = notes_of(root)
    assert "loss aggregation" not in note and "method.params.scope: batch (full), microbatch (stare)" in note
    assert arm_settings(collect_runs(root)).loc["stare", "loss aggregation"] == "TRL's dapo"


def test_arms_that_differ_only_in_their_rule_or_in_what_does_not_compute_get_no_note(tmp_path):
    root = write(
        tmp_path,
        {
            ("full", None): {},
            ("stare", None): {"trainer.save_steps": 3, "trainer.keep_batches_every": 5},
            ("ict", None): {"trainer.vllm_server_port": 8001},
        },
    )
    assert notes_of(root) == []


def test_a_long_baseline_group_is_counted_and_every_other_arm_named(tmp_path):
    arms: dict[tuple[str, str | None], dict] = {("full", None): {}}
    arms.update({(m, v): {} for m in ("stare", "ict", "rsi_band") for v in (None, "[b]")})
    arms[("ict", "[b]")] = {"trainer.loss_type": "grpo"}
    (note,) = notes_of(write(tmp_path, arms, seeds=1))
    assert "loss aggregation: TRL's dapo (full and 5 other arms), TRL's grpo (ict[b])" in note
    assert "trainer.loss_type: dapo (full and 5 other arms), grpo (ict[b])" in note


def test_the_matched_controls_of_docs_sweeps_md_expand_to_what_the_note_reads(tmp_path):
    """docs/sweeps.md, "Matched controls": its YAML block is a valid sweep whose controls resolve to the
    settings the confound note compares (full at scope microbatch; full with 2 updates per generation batch)."""
    import re

    import yaml

    from stare_lab.plan.expand import expand_sweep
    from stare_lab.plan.schema import load_sweep

    text = (Path(__file__).parents[2] / "docs" / "sweeps.md").read_text()
    section = text.split("## Matched controls", 1)[1].split("\n## ", 1)[0]
    block = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    sweep = {"name": "mc", "base": {"model": "builtin", "task": "arithmetic", "trainer": "cpu_small"}, **block}
    path = tmp_path / "mc.yaml"
    path.write_text(yaml.safe_dump({**sweep, "output": str(tmp_path / "runs")}))
    runs = expand_sweep(load_sweep(path))
    by = {(r.variant, r.seed): r.config for r in runs}
    assert {v for v, _ in by} == {"full", "clip_cov", "kl_cov", "lopti", "full[microbatch]", "full[updates=2]"}
    mb, updates = by[("full[microbatch]", 0)], by[("full[updates=2]", 0)]
    assert mb["method"]["name"] == "full" and mb["method"]["params"]["scope"] == "microbatch"
    assert by[("clip_cov", 0)]["method"]["params"]["scope"] == "microbatch"  # what the control matches
    assert updates["trainer"]["num_iterations"] == 2 == by[("lopti", 0)]["trainer"]["num_iterations"]
    assert by[("full", 0)]["trainer"]["num_iterations"] == 1
