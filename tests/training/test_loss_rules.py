"""The trainer's loss equals `objective.token_loss` for every registered rule, and a rule that changes the
loss composes with every TRL feature (issue 17; DESIGN.md §4).

1. For each rule of `list_methods()` (seed rules and the field's): the loss `TokenRuleGRPOTrainer` back-
   propagates for one micro-batch of a real (tiny) model, off-policy (old log-probs that differ from the
   current ones, so ratios and clips bite), equals `token_loss(rule, stats, state, logp)` in value and in
   gradient w.r.t. the model's parameters.
2. A loss-changing rule whose policy term is PPO's clipped surrogate itself ("ppo twin") gives TRL's own
   loss and gradient under every feature of tests/training/test_loss_compose.py (vLLM IS ratio, off-policy mask,
   entropy bonus, KL with bias correction, two-sided clipping, every PPO loss type, MoE aux loss there):
   the correction of `trl_loss.surrogate_change` cancels and everything else stays TRL's.
3. Compositions that cannot be composed honestly are refused with one line, and Lopti's two passes
   train each phase's tokens.
"""

from __future__ import annotations

import copy

import pytest
import torch
from loss_compose_support import FEATURES, G, current_logps, generation_batch, length_reward, one_thread, setup  # noqa: F401
from loss_rules_support import (
    assert_trainer_equals_token_loss,
    grads,
    make_trainer,
)

from stare_lab.methods import LossTerms, get_method, list_methods
from stare_lab.methods.full import Params as FullParams
from stare_lab.methods.registry import Rule, RuleOutput, _Entry
from stare_lab.training.objective import clipped_surrogate


@pytest.mark.parametrize("name", list_methods())
def test_trainer_loss_equals_token_loss_for_every_rule(setup, tmp_path, name):
    trainer, batch = make_trainer(setup, tmp_path, name, num_iterations=get_method(name).iterations)
    assert_trainer_equals_token_loss(trainer, batch)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("name", ["kl_cov", "dppo", "ce_gppo", "archer", "clip_cov", "adv_reweight"])
def test_loss_changing_rules_equal_token_loss_for_each_loss_type(setup, tmp_path, name, loss_type):
    trainer, batch = make_trainer(setup, tmp_path, name, loss_type=loss_type)
    assert_trainer_equals_token_loss(trainer, batch)


def test_archer_replaces_trls_kl_with_its_own_means(setup, tmp_path):
    """β > 0: Archer's KL means over its token sets replace TRL's β·k3 (value and gradient as token_loss)."""
    trainer, batch = make_trainer(setup, tmp_path, "archer", beta=0.04, ref=True)
    archer_loss = assert_trainer_equals_token_loss(trainer, batch)
    # the same batch under plain TRL's KL differs by the KL terms: Archer's is not TRL's
    full, _ = make_trainer(setup, tmp_path, "full", beta=0.04, ref=True)
    assert abs(archer_loss.item() - full._compute_loss(full.model, batch).item()) > 1e-6
    m = trainer._metrics["train"]
    assert m["rule/widened_frac"][-1] + m["rule/penalised_frac"][-1] == pytest.approx(1.0)


def test_lopti_second_pass_trains_the_other_phase(setup, tmp_path):
    trainer, batch = make_trainer(setup, tmp_path, "lopti", num_iterations=2)
    # the tiny model gives every token π_old < 0.5: η at the batch's median π_old splits it in halves
    prob = batch["old_per_token_logps"].exp()[batch["completion_mask"] > 0]
    trainer.rule = get_method("lopti", eta=float(prob.median()), alpha=0.3)  # AR+Lopti
    first = dict(batch)
    assert_trainer_equals_token_loss(trainer, first, iteration=0)
    w0 = first["token_weights"].clone()
    trainer._step = trainer.args.steps_per_generation  # TRL's second pass over the buffered batch
    second = dict(batch)
    assert_trainer_equals_token_loss(trainer, second, iteration=1)
    w1 = second["token_weights"]
    mask = batch["completion_mask"]
    assert torch.equal((w0 > 0).float() + (w1 > 0).float(), mask) and 0 < w0.sum() < w1.sum() + w0.sum()
    assert ((w0 + w1)[mask > 0] < 1).all() and ((w0 + w1)[mask > 0] >= 0.7).all()  # × adv_reweight's w ∈ [0.7, 1]
    m = trainer._metrics["train"]
    assert m["rule/phase"][-2:] == [1.0, 2.0]


# ---- a loss-changing rule whose policy term is PPO's own surrogate: TRL's loss under every feature ----
def ppo_twin(delta: float | None = None, scale: float = 1.0) -> Rule:
    """A rule that changes the loss to `scale` × PPO's clipped surrogate, as TRL computes it."""

    def weights(stats, state, p):
        return RuleOutput(weights=stats.mask.clone(), normalize="loss_type")

    def loss(batch, p):
        t = batch.trainer
        policy, _ = clipped_surrogate(
            batch.logp, batch.old_logp, batch.advantages, t.epsilon_low, t.epsilon_high, delta
        )
        return LossTerms(policy=scale * policy)

    return Rule(_Entry(f"ppo_twin_{scale}", FullParams, weights, frozenset(), None, loss=loss), FullParams())


PPO_FEATURES = [f for f, kw in FEATURES.items() if kw.get("loss_type", "dapo") in ("grpo", "bnpo", "dr_grpo", "dapo")]
PPO_FEATURES = [f for f in PPO_FEATURES if "sequence" not in str(FEATURES[f].get("importance_sampling_level"))]


@pytest.mark.parametrize("feature", PPO_FEATURES)
def test_a_rule_changing_the_surrogate_to_ppos_own_gives_trls_loss(setup, tmp_path, feature):
    kw = dict(FEATURES[feature])
    twin = ppo_twin(kw.get("delta"))
    full, batch = make_trainer(setup, tmp_path, "full", **copy.deepcopy(kw))
    ours, _ = make_trainer(setup, tmp_path, twin, **copy.deepcopy(kw))
    if ours.use_adaptive_entropy:
        full._last_world_entropy = ours._last_world_entropy = 0.0
    want_loss = full._compute_loss(full.model, dict(batch))
    want = grads(full, want_loss)
    loss = ours._compute_loss(ours.model, dict(batch))
    got = grads(ours, loss)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-5, abs=1e-7)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    # and a rule whose policy differs changes the loss by exactly its aggregated difference
    doubled = ppo_twin(kw.get("delta"), scale=2.0)
    ours2, _ = make_trainer(setup, tmp_path, doubled, **copy.deepcopy(kw))
    if ours2.use_adaptive_entropy:
        ours2._last_world_entropy = 0.0
    twice = ours2._compute_loss(ours2.model, dict(batch)).item()
    no_policy = ppo_twin(kw.get("delta"), scale=0.0)
    ours0, _ = make_trainer(setup, tmp_path, no_policy, **copy.deepcopy(kw))
    if ours0.use_adaptive_entropy:
        ours0._last_world_entropy = 0.0
    rest = ours0._compute_loss(ours0.model, dict(batch)).item()  # KL, entropy bonus, aux loss only
    assert twice - rest == pytest.approx(2 * (want_loss.item() - rest), rel=1e-4, abs=1e-6)


# ---- refusals: one line, at construction (and at resolve time for what a config can set) -------------
@pytest.mark.parametrize(
    "name, kw, match",
    [
        ("dppo", {"loss_type": "cispo", "epsilon_high": 1.1}, "dppo.*replaces PPO's clipped surrogate.*cispo"),
        ("archer", {"loss_type": "sapo"}, "archer.*sapo"),
        ("ce_gppo", {"delta": 3.0}, "ce_gppo.*delta=3.0"),
        ("kl_cov", {"importance_sampling_level": "sequence"}, "kl_cov.*per sequence"),
        ("clip_cov", {"delta": 2.0}, "clip_cov.*no dual clip"),
        ("adv_reweight", {"loss_type": "vespo"}, "adv_reweight.*vespo"),
        ("lopti", {"num_iterations": 1}, "lopti.*num_iterations=1"),
        ("lopti", {"num_iterations": 2, "beta": 0.04, "ref": True}, "lopti.*beta"),
    ],
)
def test_compositions_that_do_not_compose_are_refused(setup, tmp_path, name, kw, match):
    with pytest.raises(ValueError, match=match):
        make_trainer(setup, tmp_path, name, **kw)
