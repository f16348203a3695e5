"""Token weights composed with every TRL loss feature that composes (docs/trl_parity.md).

For each feature: with rule `full` the loss, the gradients and TRL's metrics equal plain
`GRPOTrainer`'s with the same feature on the same batch, to the bit; with a selecting rule
(weights 0/1 and fractional, normalize "valid" and "selected") the loss equals the slow loop
reference of the documented composition (tests/support/ref_loss_compose.py); the set-up is
tests/support/loss_compose_support.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures_trainer import cpu_config
from loss_compose_support import (
    FEATURES,
    G,
    assert_full_equals_plain,
    current_logps,
    length_reward,
    make_pair,
    one_thread,  # noqa: F401
    selecting_weights,
    setup,  # noqa: F401
    weighted,
)
from ref_loss_compose import reference_loss

from stare_lab.methods import NORMALIZE, get_method
from stare_lab.training.trainer import TokenRuleGRPOTrainer


@pytest.mark.parametrize("feature", list(FEATURES))
def test_full_equals_plain_trl_with_feature(setup, tmp_path, feature):
    plain, ours, batch = make_pair(setup, tmp_path, feature)
    assert torch.equal(batch["token_weights"], batch["completion_mask"])
    assert_full_equals_plain(plain, ours, batch)
    assert (plain.entropy_coef, plain._last_world_entropy) == (ours.entropy_coef, ours._last_world_entropy)


@pytest.mark.parametrize("normalize", ["valid", "selected"])
@pytest.mark.parametrize("kind", ["binary", "fractional"])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_selecting_rule_equals_loop_reference(setup, tmp_path, feature, kind, normalize):
    _, ours, batch = make_pair(setup, tmp_path, feature)
    w = selecting_weights(batch["completion_mask"], kind, seed=len(feature))
    batch = weighted(batch, w, normalize)
    logp, entropies, aux = current_logps(ours, batch)
    expected = reference_loss(ours, batch, logp, entropies, w, normalize, aux)
    loss = ours._compute_loss(ours.model, batch)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-7)
    valid_selected = (w > 0) & (batch["completion_mask"] > 0)
    assert ours._metrics["train"]["tokens/entropy_selected"][-1] == pytest.approx(
        entropies[valid_selected].mean().item(), rel=1e-5
    )


def test_selected_equals_valid_over_selected_mass_for_dapo(setup, tmp_path):
    """A hand-worked case: dapo's "selected" loss is the "valid" loss × num_items / weight_total."""
    _, ours, batch = make_pair(setup, tmp_path, "gspo_dapo")
    w = selecting_weights(batch["completion_mask"], "fractional", seed=3)
    batch = weighted(batch, w)
    losses = {}
    for normalize in ("valid", "selected"):
        batch["token_normalize"] = torch.tensor(NORMALIZE.index(normalize))
        losses[normalize] = ours._compute_loss(ours.model, batch).item()
    ratio = batch["num_items_in_batch"].item() / w.sum().item()
    assert losses["selected"] == pytest.approx(losses["valid"] * ratio, rel=1e-5)
    assert ratio > 1.2


def test_adaptive_controller_measures_the_weighted_tokens(setup, tmp_path):
    """TRL's adaptive controller accumulates Σ H·mask·w and Σ mask·w: the entropy of the weighted tokens."""
    _, ours, batch = make_pair(setup, tmp_path, "adaptive_entropy")
    ours.accelerator.gradient_state._set_sync_gradients(False)  # keep the window open to read it
    w = selecting_weights(batch["completion_mask"], "fractional", seed=4)
    batch = weighted(batch, w)
    entropies = current_logps(ours, batch)[1]
    ours._compute_loss(ours.model, batch)
    h_sum, w_sum = ours._entropy_window_stats.tolist()
    assert w_sum == pytest.approx(w.sum().item(), rel=1e-6)
    assert h_sum == pytest.approx((entropies * w).sum().item(), rel=1e-5)


def test_gradient_geometry_leaves_trl_state_alone(setup, tmp_path):
    """Geometry calls TRL's loss a second time; its metrics and the entropy controller see one call."""
    plain, ours, batch = make_pair(setup, tmp_path, "adaptive_entropy")
    ours.grad_geometry_every, ours._step = 1, 0
    assert_full_equals_plain(plain, ours, batch)
    assert ours._metrics["train"]["geometry/cosine"] == [pytest.approx(1.0)]
    assert ours._metrics["train"]["geometry/norm_ratio"] == [pytest.approx(1.0)]
    assert (plain.entropy_coef, plain._last_world_entropy) == (ours.entropy_coef, ours._last_world_entropy)


def test_top_entropy_quantile_is_refused_with_its_reason(setup, tmp_path):
    tok, model, _, task = setup
    args = cpu_config(tmp_path, per_device_train_batch_size=4, num_generations=G, top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match="top_entropy_quantile.*method=top_entropy"):
        TokenRuleGRPOTrainer(
            model=copy.deepcopy(model),
            reward_funcs=[length_reward],
            args=args,
            train_dataset=task.train_dataset(),
            processing_class=tok,
            rule=get_method("full"),
        )


def test_weight_slot_is_disarmed_after_an_error(setup, tmp_path):
    _, ours, batch = make_pair(setup, tmp_path, "sapo")
    broken = dict(batch, advantages=batch["advantages"][:1, None].expand(3, 5))  # shapes that cannot broadcast
    with pytest.raises(RuntimeError):
        ours._compute_loss(ours.model, broken)
    assert "get_high_entropy_mask" not in vars(ours) and ours.top_entropy_quantile == 1.0
