"""Every registered rule applied to one kept batch: weights, selected sets, and what the page shows of them.

A rule runs with its default parameters on the batch's statistics, with the batch's rule state
(step, total steps, seed: the same seeded tie-breaks and random draws as in training); the
run's own rule runs with its parameters and its memory as it was before the rule ran. "Selected" is
the rule's `selected` set, or every valid token for a rule without one (the trainer's definition
of `tokens/selected_frac`). For a rule that changes the loss (`Rule.changes_loss`) it is the tokens
its loss treats otherwise than PPO's (`LossTerms.touched`, at the kept batch's rollout policy against
its old log-probs: on-policy r = 1, so DPPO's trust region and CE-GPPO's clip touch nothing there),
and `touched` names how, each with its fraction in the metrics.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from stare_lab.viewer.batch import Batch

OWN_PREFIX = "run:"


@dataclass
class RuleView:
    key: str  # unique: the rule name, or "run:<name>" for the run's own rule
    name: str
    params: dict[str, Any]  # every field of the rule's Params
    own: bool = False
    weights: Tensor | None = None  # [B, T] float32, 0 on padding
    selected: Tensor | None = None  # [B, T] bool, within valid tokens
    normalize: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str | None = None  # why the rule could not run on this batch ("not computable: needs X")
    touched: dict[str, Tensor] = field(default_factory=dict)  # a loss-changing rule: how → [B, T] bool

    @property
    def computable(self) -> bool:
        return self.weights is not None

    @property
    def label(self) -> str:
        return f"{self.name} (this run)" if self.own else self.name


def _params(rule) -> dict[str, Any]:
    return {f.name: getattr(rule.params, f.name) for f in dataclasses.fields(rule.params)}


def trainer_values(batch: Batch):
    """The run's TrainerValues recorded with the batch (clip ε, β, ...), or None."""
    from stare_lab.methods import TrainerValues

    values = batch.meta.get("trainer")
    return TrainerValues(**values) if values else None


def _missing(rule, batch: Batch) -> str | None:
    """What the batch lacks for `rule`, or None."""
    needs = set(rule.needs_for(trainer_values(batch)))
    missing = sorted(n for n in needs - {"attn_entropy"} if n not in batch.stats)
    if "attn_entropy" in needs and batch.attn_for(rule.attn_layers) is None:
        layers = batch.resolve_layers(rule.attn_layers)
        missing.append(f"attn_entropy at layers {list(layers)}" if layers else "attn_entropy")
    return ", ".join(missing) if missing else None


def apply_rule(batch: Batch, name: str, params: dict[str, Any] | None = None, *, own: bool = False) -> RuleView:
    """One rule on the batch; a rule that can not run gives a view with `reason` set."""
    from stare_lab.methods import RuleState, get_method

    key = f"{OWN_PREFIX}{name}" if own else name
    try:
        rule = get_method(name, **(params or {}))
    except ValueError as err:
        return RuleView(key, name, dict(params or {}), own, reason=f"not computable: {err}")
    view = RuleView(key, name, _params(rule), own)
    missing = _missing(rule, batch)
    if missing:
        view.reason = f"not computable: needs {missing}"
        return view
    state = RuleState.from_dict(batch.rule_state)
    state.trainer = trainer_values(batch)
    if not own:
        state.memory = {}  # another rule's memory (e.g. STARE's adaptive W, M) is not this rule's
    stats = batch.token_stats(rule.attn_layers)
    try:
        out = rule(stats, state)
    except Exception as err:  # shown on the page for this rule instead of failing the whole page
        view.reason = (
            f"not computable: {err}"
            if isinstance(err, ValueError)
            else f"failed on this batch: {type(err).__name__}: {err}"
        )
        return view
    valid = stats.valid
    view.weights = out.weights.float()
    view.selected = (out.selected.bool() & valid) if out.selected is not None else valid.clone()
    view.normalize = out.normalize
    view.metrics = {k: float(v) for k, v in out.metrics.items()}
    if rule.changes_loss:
        _touched(view, rule, stats, state, out)
    return view


def _touched(view: RuleView, rule, stats, state, out) -> None:
    """A loss-changing rule's terms on the kept batch (rollout policy; entropy where kept): which tokens
    its loss changes, and how."""
    from stare_lab.methods import LossBatch

    nan = torch.full_like(stats.logp, float("nan"))
    batch = LossBatch(
        logp=stats.logp,
        old_logp=stats.old_logp if stats.old_logp is not None else stats.logp,
        advantages=stats.advantages,
        mask=stats.mask,
        entropy=stats.entropy if stats.entropy is not None else nan,
        selected=view.selected,
        trainer=state.trainer,
        ref_logp=stats.ref_logp,
    )
    try:
        terms = rule.loss_terms(batch)
    except Exception as err:  # shown for this rule, as a failing weights call
        view.reason = f"its loss failed on this batch: {type(err).__name__}: {err}"
        return
    n = max(float(stats.valid.sum()), 1.0)
    view.touched = {how: mask.bool() & stats.valid for how, mask in terms.touched.items()}
    if view.touched:
        view.selected = torch.stack(list(view.touched.values())).any(0)
    view.metrics.update({f"touched: {how}": float(m.sum()) / n for how, m in view.touched.items()})


def apply_all_rules(batch: Batch) -> list[RuleView]:
    """The run's own rule first, then every registered rule with default parameters (sorted by name)."""
    from stare_lab.methods import list_methods

    own = apply_rule(batch, batch.run_rule["name"], batch.run_rule.get("params"), own=True)
    return [own] + [apply_rule(batch, name) for name in list_methods()]


@contextmanager
def one_thread():
    """Torch on one thread for the block: the page's tensors are small, and on a shared machine
    several threads spin-wait for each other (a 64k-element sum took 60 ms instead of 1 ms)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def selected_fraction(view: RuleView, mask: Tensor) -> float | None:
    if not view.computable:
        return None
    n = float(mask.sum())
    return float(view.selected.sum()) / n if n else 0.0


def jaccard(a: Tensor, b: Tensor) -> float:
    """|a ∩ b| / |a ∪ b| of two selected sets; 1.0 when both are empty."""
    union = int((a | b).sum())
    return int((a & b).sum()) / union if union else 1.0


def overlap_matrix(views: list[RuleView]) -> tuple[list[str], np.ndarray]:
    """(keys, [R, R] Jaccard of the selected sets) over the computable rules."""
    ok = [v for v in views if v.computable]
    flat = torch.stack([v.selected.reshape(-1) for v in ok]).float() if ok else torch.zeros(0, 0)
    inter = (flat @ flat.T).double()  # [R, R] |a ∩ b|
    size = flat.sum(1).double()
    union = size[:, None] + size[None, :] - inter
    m = torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(inter))
    return [v.key for v in ok], m.numpy()


def position_histogram(selected: Tensor, mask: Tensor, bins: int = 20) -> list[int]:
    """Counts of selected tokens by relative position t / length of their response, in `bins` bins."""
    lengths = mask.sum(1, keepdim=True).clamp(min=1)  # [B, 1]
    t = torch.arange(mask.size(1), dtype=torch.float32).expand_as(mask)
    rel = (t / lengths).clamp(max=1 - 1e-9)
    idx = (rel[selected & (mask > 0)] * bins).long()
    return torch.bincount(idx, minlength=bins)[:bins].tolist()


def top_tokens(batch: Batch, selected: Tensor, k: int = 12) -> list[tuple[str, int, float]]:
    """The `k` token strings most often selected: (piece, times selected, share of its occurrences selected)."""
    valid = batch.mask > 0
    ids = batch.completion_ids.clamp(min=0)
    size = int(ids.max()) + 1 if ids.numel() else 1
    chosen = torch.bincount(ids[selected & valid], minlength=size)
    everywhere = torch.bincount(ids[valid], minlength=size)
    order = torch.argsort(-chosen, stable=True)[:k]  # ties: the smaller id first
    return [
        (batch.token_label(i), int(chosen[i]), int(chosen[i]) / int(everywhere[i]))
        for i in order.tolist()
        if chosen[i] > 0
    ]
