"""The packaged `field` sweep compares every field rule with GRPO and the seeds at the papers' settings,
and a bad field-rule value is refused before anything launches (one line, exit 2)."""

from __future__ import annotations

import pytest
from sweep_fixtures import ROOT, write_sweep

from stare_lab.cli.sweep import main
from stare_lab.methods import list_methods
from stare_lab.plan.expand import expand_sweep
from stare_lab.plan.schema import load_sweep

FIELD = ("clip_cov", "kl_cov", "dppo", "adv_reweight", "lopti", "archer", "entropy_adv", "ce_gppo")


def test_the_field_sweep_runs_every_field_rule_at_its_papers_settings():
    spec = load_sweep(ROOT / "sweeps" / "field.yaml")
    runs = {r.cfg.method.name + ":" + (r.variant or ""): r.cfg for r in expand_sweep(spec)}
    methods = {key.split(":")[0] for key in runs}
    assert set(FIELD) <= methods <= {*list_methods(), "base"} and "full" in methods  # base: the control
    by_variant = {key.split(":")[1]: cfg for key, cfg in runs.items()}
    lopti = by_variant["ar_lopti"]
    assert lopti.trainer.num_iterations == 2 and lopti.method.params.alpha == 0.3
    # the same generation batches: twice the optimizer steps for two passes over each
    assert lopti.trainer.max_steps == 2 * by_variant["grpo"].trainer.max_steps
    assert all(cfg.trainer.num_iterations == 1 for v, cfg in by_variant.items() if v != "ar_lopti")
    clip = by_variant["clip_cov"]
    assert (clip.trainer.epsilon, clip.trainer.epsilon_high, clip.method.params.ratio) == (1.0, 1.0, 2e-4)
    assert by_variant["kl_cov"].method.params.ratio == 2e-3  # the official 7B script (k_percent 0.2)
    assert by_variant["archer"].trainer.beta == 0.001 and by_variant["grpo"].trainer.beta == 0.0
    assert (by_variant["dppo_tv"].method.params.delta, by_variant["dppo_kl"].method.params.delta) == (0.15, 0.05)
    # several updates per generation batch, so the off-policy methods act (docs/field.md)
    steps = by_variant["grpo"].trainer
    assert steps.steps_per_generation == 4 * steps.gradient_accumulation_steps


def test_the_field_sweep_has_the_matched_control_of_the_per_micro_batch_rules():
    """`grpo_microbatch` (issue 26.6) differs from kl_cov in the rule only, and from clip_cov in the rule and
    the method's own ε = 1: the same scope, hence the same micro-batch aggregation, and the same recipe."""
    spec = load_sweep(ROOT / "sweeps" / "field.yaml")
    by_variant = {r.variant: r.cfg for r in expand_sweep(spec) if r.cfg.seed == 0}
    control = by_variant["grpo_microbatch"]
    assert control.method.name == "full" and control.method.params.scope == "microbatch"
    for name in ("kl_cov", "clip_cov"):
        rule = by_variant[name]
        assert rule.method.params.scope == control.method.params.scope == "microbatch"
        mine = {k: v for k, v in rule.trainer.items() if name != "clip_cov" or not k.startswith("epsilon")}
        theirs = {k: v for k, v in control.trainer.items() if k in mine}
        assert mine == theirs and mine["microbatch_aggregation"] == "verl", name
    # and plain grpo is TRL's aggregation: the control is the only arm that changes it for `full`
    assert by_variant["grpo"].method.params.scope == "batch"


def test_ar_and_ar_lopti_take_the_scripts_dual_clip_with_their_control():
    """The AR-Lopti scripts' clip_ratio_c = 10 as TRL's delta (issue 27.2), and `full` with the same δ."""
    spec = load_sweep(ROOT / "sweeps" / "field.yaml")
    by_variant = {r.variant: r.cfg for r in expand_sweep(spec) if r.cfg.seed == 0}
    for name in ("adv_reweight", "ar_lopti", "grpo_dual_clip"):
        assert by_variant[name].trainer.delta == 10.0, name
    assert by_variant["grpo_dual_clip"].method.name == "full"
    assert by_variant["grpo"].trainer.delta is None
    for name in ("clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "archer", "ce_gppo"):  # own dual clip or none
        assert by_variant[name].trainer.delta is None, name


@pytest.mark.parametrize(
    "override, words",
    [
        ("method.params.ratio: 0.0", "ratio=0.0 is out of range"),
        ("method.params.variant: js", "variant='js' is not one of tv, kl"),
        ("method.params.kappa: -1.0", "kappa=-1.0 is out of range"),
        ("method.params.eta: 1.0", "eta=1.0 is out of range"),
        ("method.params.q: 1.5", "q=1.5 is out of range"),
        ("method.params.alpha: 1.5", "alpha=1.5 is out of range"),
        ("method.params.lb: 6.0", "lb=6.0 must be below ub=5.0"),
    ],
)
def test_a_bad_field_value_is_one_line_exit_2_and_launches_nothing(tmp_path, capsys, override, words):
    key, value = override.split(": ")
    method = {
        "ratio": "kl_cov",
        "variant": "dppo",
        "kappa": "entropy_adv",
        "eta": "lopti",
        "q": "archer",
        "alpha": "adv_reweight",
        "lb": "clip_cov",
    }[key.split(".")[-1]]
    value = float(value) if value[0] in "-0123456789" else value
    path = write_sweep(tmp_path, "bad_field", overrides={key: value}, grid={"method": [method]})
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("status.json"))
