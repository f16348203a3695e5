"""Every registered rule applied to one kept batch: weights, selected sets, and what the page shows of them.

A rule runs with its default parameters on the batch's statistics, with the batch's rule state
(step, total steps, seed: the same seeded tie-breaks and random draws as in training); the
run's own rule runs with its parameters and its memory as it was before the rule ran. "Selected" is
the rule's `selected` set, or every valid token for a rule without one (the trainer's definition
of `tokens/selected_frac`). For a rule that changes the loss (`Rule.changes_loss`) it is the tokens
its loss treats otherwise than PPO's (`LossTerms.touched`, at the kept batch's rollout policy against
its old log-probs: on-policy r = 1, so DPPO's trust region and CE-GPPO's clip touch nothing there),
and `touched` names how, each with its fraction in the metrics.

The run's own rule, where it chose its tokens in the loss (scope "microbatch" or "token") or changed the
loss, is shown as it trained: one view per pass of the loss over the batch, from the kept loss record
(`Batch.updates`: the training forward's weights, selected and touched tokens), and `replay` runs the
rule again micro-batch by micro-batch on the recorded statistics to check that record
(`reproduces`). Every view has the trained and touched fractions of docs/run_record.md
(`token_weights.token_fractions`).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from stare_lab.methods import LossBatch, RuleState, TrainerValues, get_method, list_methods
from stare_lab.record.kept_batch import Batch
from stare_lab.signals import distributed
from stare_lab.stats import TokenStats
from stare_lab.training.token_weights import token_fractions

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
    note: str | None = None  # the run's rule: where its view comes from ("in the loss, pass 1 of 2")
    update: int | None = None  # the pass of the loss record it shows (None: computed on the kept batch)
    reproduces: bool | None = None  # the loss record: the rule replayed on it gives the recorded weights
    replay_note: str | None = None  # why it was not replayed, or what differed

    @property
    def computed(self) -> tuple[Tensor, Tensor] | None:
        """(weights, selected) of a rule that ran on the batch (both are set together); None for one that could not."""
        if self.weights is None or self.selected is None:
            return None
        return self.weights, self.selected

    @property
    def computable(self) -> bool:
        return self.computed is not None

    @property
    def label(self) -> str:
        if not self.own:
            return self.name
        return f"{self.name} (this run, {self.note})" if self.note else f"{self.name} (this run)"


def _params(rule) -> dict[str, Any]:
    return {f.name: getattr(rule.params, f.name) for f in dataclasses.fields(rule.params)}


def trainer_values(batch: Batch):
    """The run's TrainerValues recorded with the batch (clip ε, β, ...), or None."""
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
    selected = (out.selected.bool() & valid) if out.selected is not None else valid.clone()
    view.weights, view.selected = out.weights.float(), selected
    view.normalize = out.normalize
    view.metrics = {k: float(v) for k, v in out.metrics.items()}
    if rule.changes_loss:
        _touched(view, selected, rule, stats, state, out)
    return view


def _touched(view: RuleView, selected: Tensor, rule, stats, state, out) -> None:
    """A loss-changing rule's terms on the kept batch (rollout policy; entropy where kept): which tokens
    its loss changes, and how."""
    nan = torch.full_like(stats.logp, float("nan"))
    batch = LossBatch(
        logp=stats.logp,
        old_logp=stats.old_logp if stats.old_logp is not None else stats.logp,
        advantages=stats.advantages,
        mask=stats.mask,
        entropy=stats.entropy if stats.entropy is not None else nan,
        selected=selected,
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
    """The run's own rule first (one view per recorded pass of the loss where it has a loss record),
    then every registered rule with default parameters (sorted by name)."""
    own = own_views(batch)
    return own + [apply_rule(batch, name) for name in list_methods()]


def own_views(batch: Batch) -> list[RuleView]:
    """The run's rule as it trained on the batch: from the loss record (one view per completed pass),
    or computed on the kept batch for a rule that chose its weights at generation."""
    name, params = batch.run_rule["name"], batch.run_rule.get("params")
    if not batch.records_loss:
        return [apply_rule(batch, name, params, own=True)]
    passes = int(batch.loss_meta.get("iterations", 1))
    if not batch.updates:  # the run stopped before the first pass over the batch ended
        view = apply_rule(batch, name, params, own=True)
        view.note = "at the rollout policy: the run kept no pass of its loss over this batch"
        return [view]
    replayed = replay(batch)
    views = []
    for u in batch.updates:
        key = f"{OWN_PREFIX}{name}" + (f"@{u.index + 1}" if u.index else "")
        view = RuleView(key, name, dict(params or {}), own=True, update=u.index)
        view.note = f"in the loss, pass {u.index + 1} of {passes}" if passes > 1 else "in the loss"
        valid = batch.mask > 0
        view.weights = torch.where(valid, u.weights, torch.zeros_like(u.weights))
        view.selected = u.selected & valid
        view.normalize = batch.loss_meta.get("normalize")
        view.touched = {how: m & valid for how, m in u.touched.items()}
        if view.touched and batch.loss_meta.get("changes_loss"):
            view.selected = torch.stack(list(view.touched.values())).any(0)
        view.metrics = _mean_metrics(u.metrics)
        n = max(float(valid.sum()), 1.0)
        view.metrics.update({f"touched: {how}": float(m.sum()) / n for how, m in view.touched.items()})
        if isinstance(replayed, str):
            view.replay_note = replayed
        else:
            view.reproduces, view.replay_note = _compare(u, view, replayed[u.index], valid)
        views.append(view)
    return views


def _mean_metrics(per_micro_batch: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the micro-batches of a pass (as TRL averages a step's micro-batches)."""
    keys = sorted({k for m in per_micro_batch for k in m})
    return {k: float(np.mean([m[k] for m in per_micro_batch if k in m])) for k in keys}


def _compare(update, view: RuleView, replayed: dict[str, Any], valid: Tensor) -> tuple[bool, str | None]:
    """Does the replayed pass give the recorded weights (and touched sets)? With what differed."""
    if not torch.equal(replayed["weights"][valid], update.weights[valid]):
        return False, "the rule replayed on the recorded statistics gives other weights than the record"
    for how, mask in update.touched.items():
        if how not in replayed["touched"] or not torch.equal(replayed["touched"][how] & valid, mask & valid):
            return False, f"the rule replayed on the recorded statistics touches other tokens ({how})"
    return True, None


def replay(batch: Batch) -> list[dict[str, Any]] | str:
    """The run's rule run again on the loss record, micro-batch by micro-batch and pass by pass, as the
    trainer ran it (`TokenRuleGRPOTrainer._microbatch_weights`, `token_weights.microbatch_stats`, the
    loss's `LossBatch`): per pass {"weights": [B, T], "touched": {how: [B, T] bool}}; or a one-line
    reason where it can not be replayed (an unknown rule, micro-batches gathered over several ranks)."""
    meta = batch.loss_meta
    try:
        rule = get_method(batch.run_rule["name"], **(batch.run_rule.get("params") or {}))
    except ValueError as err:
        return f"not replayed: {err}"
    values = trainer_values(batch)
    in_loss = bool(meta.get("selects_in_loss"))
    if (
        in_loss
        and meta.get("ranks") == "gathered"
        and meta.get("scope") != "token"
        and meta.get("num_processes", 1) > 1
    ):
        return "not replayed: the rule selected over the micro-batches of every rank (microbatch_ranks gathered)"
    process = batch.process if batch.process is not None else torch.zeros(batch.shape[0], dtype=torch.long)
    B, T = batch.shape
    out = [{"weights": torch.full((B, T), float("nan")), "touched": {}} for _ in batch.updates]
    for p in sorted(set(process.tolist())):
        state = RuleState.from_dict(batch.rule_state)  # each rank's rule state, from before the batch
        state.trainer = values
        if rule.step_needs_for(values):
            state.step_stats = batch.token_stats(rule.attn_layers)  # the generation batch's, as the trainer kept it
        for u in batch.updates:
            state.iteration = u.index
            for mb in range(int(meta.get("micro_batches", 1))):
                rows = torch.nonzero((process == p) & (u.micro_batch == mb), as_tuple=True)[0]
                if rows.numel() == 0:
                    continue
                rows = rows[torch.argsort(u.position[rows])]
                try:
                    _replay_micro_batch(batch, rule, state, u, rows, int(p), in_loss, out[u.index])
                except Exception as err:  # a rule failing here is shown, not raised
                    return f"not replayed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return out


def _replay_micro_batch(batch: Batch, rule, state, u, rows: Tensor, p: int, in_loss: bool, out: dict) -> None:
    """One micro-batch (`rows` of the batch, in their order in it) of pass `u` on rank `p` into `out`."""
    needs = rule.needs_for(state.trainer)
    b = rows.numel()
    mask = batch.mask[rows]
    logp = u.logp[rows]
    old = batch.loss_old_logp[rows] if batch.loss_old_logp is not None else logp
    ref = batch.loss_ref_logp[rows] if batch.loss_ref_logp is not None else None
    advantages = batch.advantages[rows]
    if in_loss:  # token_weights.microbatch_stats
        fields: dict[str, Tensor] = {}
        if "entropy" in needs:
            fields["entropy"] = u.entropy[rows]
        if "old_logp" in needs:
            fields["old_logp"] = old
        if "ref_logp" in needs and ref is not None:
            fields["ref_logp"] = ref
        stats = TokenStats(
            logp=logp if "logp" in needs else torch.full_like(logp, float("nan")),
            mask=mask,
            advantages=advantages,
            group=p * b + torch.arange(b),
            **fields,
        )
        with distributed.deterministic():
            result = rule(stats, state)
        weights = result.weights.float()
        selected = (result.selected if result.selected is not None else stats.valid) & stats.valid
    else:  # the weights came from generation: the record's
        weights = u.weights[rows]
        selected = u.selected[rows]
    out["weights"][rows] = weights
    if rule.changes_loss:
        terms = rule.loss_terms(
            LossBatch(
                logp=logp,
                old_logp=old,
                advantages=advantages,
                mask=mask,
                entropy=u.entropy[rows],
                selected=selected,
                trainer=state.trainer,
                ref_logp=ref,
            )
        )
        for how, m in terms.touched.items():
            out["touched"].setdefault(how, torch.zeros(batch.shape, dtype=torch.bool))[rows] = m.bool()


def fractions(view: RuleView, mask: Tensor) -> tuple[float, float] | None:
    """(trained, touched) shares of the valid tokens (`token_weights.token_fractions`, as the trainer logs
    tokens/trained_frac and tokens/touched_frac), or None for a rule that could not run."""
    if view.computed is None:
        return None
    weights, _ = view.computed
    trained, touched = token_fractions(weights, mask, view.touched)
    n = float((mask > 0).sum())
    return (float(trained.sum()) / n, float(touched.sum()) / n) if n else (0.0, 0.0)


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
    if view.computed is None:
        return None
    _, selected = view.computed
    n = float(mask.sum())
    return float(selected.sum()) / n if n else 0.0


def jaccard(a: Tensor, b: Tensor) -> float:
    """|a ∩ b| / |a ∪ b| of two selected sets; 1.0 when both are empty."""
    union = int((a | b).sum())
    return int((a & b).sum()) / union if union else 1.0


def overlap_matrix(views: list[RuleView]) -> tuple[list[str], np.ndarray]:
    """(keys, [R, R] Jaccard of the selected sets) over the computable rules."""
    ok = [(v.key, c[1]) for v in views if (c := v.computed) is not None]
    flat = torch.stack([selected.reshape(-1) for _, selected in ok]).float() if ok else torch.zeros(0, 0)
    inter = (flat @ flat.T).double()  # [R, R] |a ∩ b|
    size = flat.sum(1).double()
    union = size[:, None] + size[None, :] - inter
    m = torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(inter))
    return [key for key, _ in ok], m.numpy()


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
