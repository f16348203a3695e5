"""The invariants every token rule must satisfy.

`make_stats(rule, ...)` builds exactly the statistics the rule declares (the one stats factory,
tests/support/rule_batches.py, filtered by `rule.needs_for(trainer)`), so a rule that reads a statistic it
did not declare fails (an undeclared statistic is None, an undeclared logp NaN).
`tests/methods/test_rule_invariants.py` runs every check over `list_methods()`; a rule's own test file
calls `check_all` for non-default parameters.
"""

from __future__ import annotations

import dataclasses
import math

import rule_batches
import torch
from rule_batches import TRAINER

from stare_lab.methods import LossBatch, Rule, RuleState, TrainerValues
from stare_lab.methods.registry import NORMALIZE
from stare_lab.stats import STATISTICS, TokenStats
from stare_lab.training.objective import Aggregation, aggregate

PADDING = (float("nan"), float("inf"), -float("inf"), 1e3, -1e3)


def make_stats(
    rule: Rule,
    B: int = 8,
    T: int = 6,
    seed: int = 0,
    *,
    entropy_scale: float | None = None,
    lengths: list[int] | None = None,
    pad: float | None = None,
    trainer: TrainerValues = TRAINER,
) -> TokenStats:
    """Exactly the statistics `rule` declares under `trainer` (the one factory, tests/support/rule_batches.py):
    an undeclared statistic is None, an undeclared logp NaN; `pad` on every padding position
    (None: the drawn values stay there)."""
    return rule_batches.make_stats(
        seed, B, T, entropy_scale=entropy_scale, pad_value=pad, lengths=lengths, needs=rule.needs_for(trainer)
    )


def state(step: int = 20, trainer: TrainerValues = TRAINER) -> RuleState:
    # step 20 of 40: past the default warm-ups, mid-schedule
    return RuleState(step=step, total_steps=40, seed=3, trainer=trainer)


def _metrics_finite(out) -> bool:
    return all(isinstance(v, float) and math.isfinite(v) for v in out.metrics.values())


def check_padding_ignored(rule: Rule) -> None:
    """Whatever the padding holds, the weights are those of a clean batch, and 0 there."""
    for entropy_scale in (None, 0.1):
        clean = make_stats(rule, entropy_scale=entropy_scale)
        want = rule(clean, state())
        for pad in PADDING:
            dirty = make_stats(rule, entropy_scale=entropy_scale, pad=pad)
            got = rule(dirty, state())
            assert torch.equal(got.weights, want.weights), (rule, pad)
            assert (got.weights[~dirty.valid] == 0).all()
            assert got.metrics == want.metrics, (rule, pad)


def check_finite(rule: Rule) -> None:
    for seed in range(3):
        for entropy_scale in (None, 0.1):
            for step in (0, 20, 39):
                stats = make_stats(rule, seed=seed, entropy_scale=entropy_scale)
                out = rule(stats, state(step))
                assert out.weights.shape == stats.shape and out.weights.dtype == torch.float32
                assert torch.isfinite(out.weights).all() and (out.weights >= 0).all(), rule
                assert (out.weights[~stats.valid] == 0).all()
                assert _metrics_finite(out), (rule, out.metrics)
                again = rule(stats, state(step))
                assert torch.equal(out.weights, again.weights), "same batch and state, same weights"


def check_all_padding(rule: Rule) -> None:
    stats = make_stats(rule, lengths=[0] * 8)
    out = rule(stats, state())
    assert (out.weights == 0).all(), rule
    # a mean over no token may be NaN (STARE's H̄): a float, never an exception or a tensor
    assert all(isinstance(v, float) and not math.isinf(v) for v in out.metrics.values()), (rule, out.metrics)


def check_one_valid_token(rule: Rule) -> None:
    for step in (0, 20):
        stats = make_stats(rule, lengths=[0, 0, 1, 0, 0, 0, 0, 0], entropy_scale=0.1)
        out = rule(stats, state(step))
        assert torch.isfinite(out.weights).all() and _metrics_finite(out), (rule, out.metrics)
        assert (out.weights[~stats.valid] == 0).all() and float(out.weights[2, 0]) >= 0


def check_declared_normalisation(rule: Rule) -> None:
    stats = make_stats(rule)
    out = rule(stats, state())
    assert out.normalize in NORMALIZE
    assert out.normalize == getattr(rule.params, "normalize", out.normalize)
    if out.selected is not None:
        assert out.selected.dtype == torch.bool and not (out.selected & ~stats.valid).any()


def check_split_independent(rule: Rule) -> None:
    """Weights are computed once per generation batch; the loss summed over equal micro-batches
    (with the generation batch's weight total, as the trainer passes it) equals the whole batch's."""
    stats = make_stats(rule, B=8, T=6, seed=5)
    out = rule(stats, state())
    loss = torch.randn(stats.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w, mask = out.weights.double(), stats.mask.double()
    totals = dict(num_items=mask.sum(), weight_total=w.sum())
    for loss_type in ("dapo", "grpo", "dr_grpo"):

        def split(k: int) -> float:
            agg = Aggregation(loss_type=loss_type, grad_accum=k, steps_per_generation=k, max_completion_length=6)
            rows = 8 // k
            return sum(
                float(
                    aggregate(
                        loss[i : i + rows], w[i : i + rows], mask[i : i + rows], agg, normalize=out.normalize, **totals
                    )
                )
                for i in range(0, 8, rows)
            )

        assert math.isclose(split(1), split(2), rel_tol=1e-12, abs_tol=1e-12), (rule, loss_type)
        assert math.isclose(split(1), split(4), rel_tol=1e-12, abs_tol=1e-12), (rule, loss_type)


def check_declarations(rule: Rule) -> None:
    assert rule.needs_for(TRAINER) <= set(STATISTICS)
    rule.check_trainer(dataclasses.replace(TRAINER, num_iterations=rule.iterations))  # defaults follow the trainer
    if "attn_entropy" not in rule.needs_for(TRAINER):
        assert rule.attn_layers is None, "attention layers declared by a rule that reads no attention entropy"


def _loss_batch(rule: Rule, pad: float | None, lengths: list[int] | None = None, seed: int = 0, layout=lambda x: x):
    """The rule's `loss` on a batch whose padding holds `pad` in every tensor; log π with grad (a leaf);
    `layout` lays every tensor out in memory (`strided`: not row-major)."""
    full = rule_batches.make_stats(seed, 8, 6, pad_value=pad, lengths=lengths)  # every statistic, old and ref too
    stats = make_stats(rule, seed=seed, pad=pad, lengths=lengths)
    out = rule(stats, state())
    logp = layout(full.logp.double()).detach().requires_grad_(True)
    selected = out.selected if out.selected is not None else stats.valid
    batch = LossBatch(
        logp=logp,
        old_logp=layout(full.old_logp.double()),
        advantages=layout(full.advantages.double()),
        mask=layout(full.mask.double()),
        entropy=layout(full.entropy.double()),
        selected=layout(selected),
        trainer=TRAINER,
        ref_logp=layout(full.ref_logp.double()),
    )
    return rule.loss_terms(batch), logp, full.mask


def check_loss_terms(rule: Rule) -> None:
    """A loss-changing rule's terms: finite on valid tokens, the same whatever padding holds, no gradient
    reaching a padding position once masked, finite on an all-padding and a one-token batch."""
    if not rule.changes_loss:
        return
    clean, _, mask = _loss_batch(rule, None)
    valid = mask > 0
    assert torch.isfinite(clean.policy[valid]).all(), rule
    for pad in PADDING:
        dirty, logp, _ = _loss_batch(rule, pad)
        assert torch.equal(torch.where(valid, dirty.policy, 0), torch.where(valid, clean.policy, 0)), (rule, pad)
        assert (clean.own is None) == (dirty.own is None) and (clean.own is None or torch.equal(clean.own, dirty.own))
        assert all(math.isfinite(v) for v in dirty.metrics.values()), (rule, dirty.metrics)
    # the model's log-probs on padding are finite (TRL's forward): no gradient reaches them through the mask
    terms, logp, _ = _loss_batch(rule, -0.5)
    total = (terms.policy * mask).sum() + (terms.own if terms.own is not None else 0)
    (grad,) = torch.autograd.grad(total, logp, allow_unused=True)
    assert grad is not None and torch.isfinite(grad).all() and (grad[~valid] == 0).all(), rule
    for lengths in ([0] * 8, [0, 0, 1, 0, 0, 0, 0, 0]):
        terms, _, m = _loss_batch(rule, float("nan"), lengths=lengths)
        assert torch.isfinite(terms.policy[m > 0]).all() and (terms.own is None or torch.isfinite(terms.own))
        assert all(isinstance(v, float) and math.isfinite(v) for v in terms.metrics.values()), (rule, terms.metrics)


def strided(x):
    """The same values in memory that is not row-major: a [B, T] tensor as the transpose of a contiguous
    [T, B] one (`.T.contiguous().T`, as verl's KL-Cov mask test runs every case on `.T`), a [B] tensor as
    every other element of a [2B] one. What a column slice, a transposed gather or TRL's own forward
    may hand a rule."""
    if not torch.is_tensor(x):
        return x
    if x.dim() == 2:
        out = x.T.contiguous().T
    elif x.dim() == 1:
        out = torch.stack([x, x], -1)[:, 0]
    else:
        return x
    torch.testing.assert_close(out, x, rtol=0, atol=0, equal_nan=True)
    return out


def _same_metrics(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)


def check_any_strides(rule: Rule) -> None:
    """Every rule accepts inputs of any strides and gives exactly what it gives on contiguous ones: its
    weights, selection and metrics, and a loss-changing rule's terms and their gradient (issue 27.3)."""
    for seed, entropy_scale in ((0, None), (1, 0.1), (2, None)):
        stats = make_stats(rule, seed=seed, entropy_scale=entropy_scale)
        fields = {f.name: strided(getattr(stats, f.name)) for f in dataclasses.fields(stats)}
        other = dataclasses.replace(stats, **fields)
        assert not other.logp.is_contiguous() and not other.mask.is_contiguous()
        want, got = rule(stats, state()), rule(other, state())
        assert torch.equal(got.weights, want.weights), (rule, seed)
        assert got.normalize == want.normalize and _same_metrics(got.metrics, want.metrics), (rule, got.metrics)
        assert (got.selected is None) == (want.selected is None), rule
        assert got.selected is None or torch.equal(got.selected, want.selected), (rule, seed)
    if not rule.changes_loss:
        return
    terms, logp, _ = _loss_batch(rule, None)
    total = (terms.policy * logp.detach().isfinite()).sum() + (terms.own if terms.own is not None else 0)
    (grad,) = torch.autograd.grad(total, logp)
    s_terms, s_logp, _ = _loss_batch(rule, None, layout=strided)
    s_total = (s_terms.policy * s_logp.detach().isfinite()).sum() + (s_terms.own if s_terms.own is not None else 0)
    (s_grad,) = torch.autograd.grad(s_total, s_logp)
    assert torch.equal(s_terms.policy, terms.policy) and torch.equal(s_grad, grad), rule
    assert (terms.own is None) == (s_terms.own is None) and (terms.own is None or torch.equal(terms.own, s_terms.own))
    assert _same_metrics(s_terms.metrics, terms.metrics), rule
    assert terms.touched.keys() == s_terms.touched.keys()
    assert all(torch.equal(terms.touched[k], s_terms.touched[k]) for k in terms.touched), rule


CHECKS = (
    check_declarations,
    check_any_strides,
    check_loss_terms,
    check_padding_ignored,
    check_finite,
    check_all_padding,
    check_one_valid_token,
    check_declared_normalisation,
    check_split_independent,
)


def check_all(rule: Rule) -> None:
    for check in CHECKS:
        check(rule)
