"""`objective.token_loss` equals the trainer's loss for every trainer value a rule can see (issue 27.1):
TRL's two-sided clipping `delta` (the AR-Lopti scripts' dual clip, clip_ratio_c = 10), GSPO's per-sequence
importance sampling and the luspo loss type, in value and in gradient w.r.t. the model's parameters, on a
real (tiny) model's off-policy micro-batch whose ratios bite: tokens with r > δ and A < 0 (where the
dual clip zeroes the gradient) and with r > δ and A > 0 (where it must change nothing).

The surrogate itself against a loop reference and cases worked by hand: tests/training/test_objective.py.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from loss_compose_support import current_logps, one_thread, setup  # noqa: F401
from loss_rules_support import assert_trainer_equals_token_loss, grads, logp_with_grad, make_trainer, reference_stats

from stare_lab.methods import get_method, list_methods
from stare_lab.training.objective import token_loss

DELTA = 10.0  # AR-Lopti scripts/train_kklogic_AR*_4x80GB.sh: actor.clip_ratio_c=10.0
T_MAX = 12
# the field's rules that apply a dual clip of their own or none (refuse_delta): TRL's delta is refused
REFUSE_DELTA = {"clip_cov", "kl_cov", "dppo", "archer", "ce_gppo"}


def far_off_policy(trainer, batch):
    """π_old three nats below the current policy on every third position (r = e³ ≈ 20.1 > δ = 10), so the
    cap binds on tokens of both signs of A; the rest keep the fixture's ±0.3-nat noise (with every other
    position, GMTS's top 20 % by |H·r·A| would be capped or clipped tokens only: no gradient at all)."""
    logp = current_logps(trainer, batch)[0]
    mask = batch["completion_mask"]
    far = (torch.arange(mask.size(1))[None, :] % 3 == 0) & (mask > 0)
    batch["old_per_token_logps"] = torch.where(far, logp - 3.0, batch["old_per_token_logps"])
    adv = batch["advantages"]
    adv = adv[:, None].expand_as(mask) if adv.dim() == 1 else adv
    capped = far & (adv < 0)
    assert capped.any() and (far & (adv > 0)).any(), "the batch must have r > δ with A < 0 and A > 0"
    return capped


def assert_delta_bites(trainer, batch, iteration=0):
    """token_loss without δ differs from the trainer's loss: the comparison above can fail."""
    state = copy.deepcopy(trainer.rule_state)
    state.iteration = iteration
    stats = reference_stats(trainer, batch)
    logp, _ = logp_with_grad(trainer, batch)
    values = trainer.rule_state.trainer
    assert values.delta == DELTA
    state.trainer = values
    with_delta = token_loss(trainer.rule, stats, state, logp, max_completion_length=T_MAX)
    g_with = grads(trainer, with_delta)
    logp, _ = logp_with_grad(trainer, batch)
    state.trainer = dataclasses.replace(values, delta=None)
    without = token_loss(trainer.rule, stats, state, logp, max_completion_length=T_MAX)
    g_without = grads(trainer, without)
    assert abs(with_delta.item() - without.item()) > 1e-3 * abs(without.item())
    assert max((a - b).abs().max().item() for a, b in zip(g_with, g_without, strict=True)) > 1e-4


@pytest.mark.parametrize("name", list_methods())
def test_token_loss_equals_the_trainers_loss_with_trls_delta(setup, tmp_path, name):
    """Every rule that composes with TRL's δ: the trainer's loss (TRL's own, δ included) = token_loss."""
    kw = dict(delta=DELTA, num_iterations=get_method(name).iterations)
    if name in REFUSE_DELTA:
        with pytest.raises(ValueError, match=f"{name}.*delta={DELTA}"):
            make_trainer(setup, tmp_path, name, **kw)
        return
    trainer, batch = make_trainer(setup, tmp_path, name, **kw)
    far_off_policy(trainer, batch)
    assert_trainer_equals_token_loss(trainer, batch)
    assert_delta_bites(trainer, batch)


def test_ar_lopti_at_the_scripts_settings_equals_token_loss_in_both_passes(setup, tmp_path):
    """AR+Lopti (α 0.3, η 0.5, δ 10: train_kklogic_AR-Lopti_4x80GB.sh) in each of its two passes."""
    trainer, batch = make_trainer(setup, tmp_path, "lopti", num_iterations=2, delta=DELTA)
    prob = batch["old_per_token_logps"].exp()[batch["completion_mask"] > 0]
    # the tiny model gives every token π_old < 0.5: η at the median splits the batch so both passes train
    trainer.rule = get_method("lopti", eta=float(prob.median()), alpha=0.3)
    far_off_policy(trainer, batch)
    assert_trainer_equals_token_loss(trainer, dict(batch), iteration=0)
    trainer._step = trainer.args.steps_per_generation  # TRL's second pass over the buffered batch
    assert_trainer_equals_token_loss(trainer, dict(batch), iteration=1)


def test_the_dual_clip_zeroes_the_gradient_of_capped_negative_tokens(setup, tmp_path):
    """The per-token gradient of the trainer's loss w.r.t. log π is 0 exactly where r > δ and A < 0, and
    token_loss's is the same tensor."""
    trainer, batch = make_trainer(setup, tmp_path, "full", delta=DELTA)
    capped = far_off_policy(trainer, batch)
    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def keep_logp(*args, **kwargs):
        out = original(*args, **kwargs)
        out[0].retain_grad()
        captured.setdefault("logp", out[0])
        return out

    trainer._get_per_token_logps_and_entropies = keep_logp
    loss = trainer._compute_loss(trainer.model, batch)
    del trainer._get_per_token_logps_and_entropies
    loss.backward()
    g_trainer = captured["logp"].grad
    stats = reference_stats(trainer, batch)
    logp, _ = logp_with_grad(trainer, batch)
    logp = logp.detach().requires_grad_(True)
    (g_ours,) = torch.autograd.grad(token_loss(trainer.rule, stats, trainer.rule_state, logp), logp)
    assert (g_trainer[capped] == 0).all() and (g_ours[capped] == 0).all()
    other = (batch["completion_mask"] > 0) & ~capped & (batch["advantages"][:, None] != 0)
    assert (g_trainer[other] != 0).any()
    torch.testing.assert_close(g_ours, g_trainer, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize(
    "kw",
    [
        dict(loss_type="grpo", importance_sampling_level="sequence"),  # GSPO
        dict(loss_type="dapo", importance_sampling_level="sequence", delta=1.5),
        dict(loss_type="luspo", importance_sampling_level="sequence"),  # LUSPO's recommended set-up
        dict(loss_type="luspo", delta=DELTA),
    ],
    ids=["gspo", "gspo_dapo_delta", "luspo_sequence", "luspo_token_delta"],
)
@pytest.mark.parametrize("name", ["full", "top_entropy", "adv_reweight"])
def test_token_loss_equals_the_trainers_loss_per_sequence_and_for_luspo(setup, tmp_path, name, kw):
    trainer, batch = make_trainer(setup, tmp_path, name, **kw)
    assert trainer.rule_state.trainer.importance_sampling_level == kw.get("importance_sampling_level", "token")
    if "delta" in kw and kw.get("importance_sampling_level") != "sequence":
        far_off_policy(trainer, batch)
    assert_trainer_equals_token_loss(trainer, batch)


def test_an_own_surrogate_loss_type_is_one_line():
    from rule_batches import TRAINER, make_stats

    from stare_lab.methods import RuleState

    stats = make_stats(0, 4, 3)
    state = RuleState(trainer=dataclasses.replace(TRAINER, loss_type="cispo"))
    with pytest.raises(ValueError, match="loss_type='cispo' is not supported"):
        token_loss(get_method("full"), stats, state, stats.logp)
