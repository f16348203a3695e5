"""stare: Surprisal-guided Token-level Advantage Reweighting for Entropy stability (arXiv 2606.19236).

Weight of token t of rollout i, with surprisal s = -log π and batch entropy H̄ (token mean of H over
valid tokens):

    ω_i,t = W   if H̄ < H_tgt and t ∈ L+   (L+ = top ⌈P·|T+|⌉ of T+ = {A > 0} by s)
            M   if H̄ < H_tgt and t ∈ L-   (C2 only; L- likewise in T- = {A < 0})
            1   otherwise (A = 0 tokens, and every token while the gate is closed)

ω multiplies the clipped per-token loss; the loss is not renormalised (normalize="valid").

Deviations and decisions:
1. [code] Gate, selection and weights as in hp-luo/STARE `compute_stare_token_weights` and
   `STAREController`; the gate is strict (H̄ = H_tgt closes it).
2. [ours] Selection once per generation batch from the rollout policy's statistics (scope
   "batch" by default); the official code selects per micro-batch with the current policy.
   scope="microbatch" runs it as the official code does (docs/pitfalls.md, "scope: microbatch"):
   L+ / L- per micro-batch (per process by default) by the training forward's surprisal, while
   the gate and the adaptive W/M are the controller's, once per step (rule-state step) from H̄ of
   the whole generation batch of every rank (`state.step_stats`, the rollout policy, as the
   official trainer takes it from its old-log-prob pass) and used unchanged by every micro-batch.
   On-policy with transformers generation TRL makes no old-log-prob forward, so that H̄ comes from
   the entropy recorded while sampling (≈ 0.3% of a step on the built-in model, README Performance);
   with vLLM or num_iterations > 1 it is computed in TRL's old-log-prob forward.
3. [ours] Ties at the top-k boundary broken by a seeded random order (ties="topk"); the official
   `torch.topk` breaks them arbitrarily.
4. [code] Adaptive W/M: the update uses this batch's H̄ and happens *before* this batch's weights
   are computed (the official trainer calls `STAREController.update(H̄_k)` after the old-logprob
   pass and the actor reads the already-updated W, M). It runs whether or not the gate is open.
   sgn(0) = 0. Current W, M live in `state.memory` so a resumed run continues them.
5. [ours] With normalize="valid" (the loss type's own denominator), a closed gate gives exactly
   the `full` rule's weights and loss.
6. [ours] H̄ and the gate are taken over the global generation batch (scope batch: the one the
   rule sees; scope microbatch: `state.step_stats`). Metrics:
   rule/gate, rule/entropy_mean, rule/W, rule/M (the values used for this batch) and
   rule/boosted_frac (|L+| / valid tokens, 0 while the gate is closed). `selected` is L+ ∪ L-
   while the gate is open and every valid token while it is closed (all weights 1), so
   tokens/selected_frac and tokens/entropy_selected describe the reweighted tokens; STARE trains on
   every valid token (tokens/trained_frac = 1 unless M = 0) and touches L+ ∪ L- (tokens/touched_frac:
   the tokens with W or M ≠ 1 while the gate is open, 0 while it is closed).
7. [code] A non-finite H̄ (a batch with no valid token, or a NaN/inf entropy) skips the controller
   update: W, M and the gate keep their previous values, as `STAREController.update` returns early
   on a non-finite entropy. The gate is kept in `state.memory["gate"]`; before any finite H̄ it is
   open (the official controller starts with `gate_on = True`).
8. [code] k = ⌈P·n⌉ as `ceil(P·n − 1e-9)`; the official `int(P·n + 0.999999)` rounds down where
   P·n lies less than 1e-6 above an integer (n ≥ 10^5 tokens at P = 0.1 at the earliest). Its
   surrogate also has verl's dual clip (c = 3 for A < 0), which binds only at ratios > 3, never on
   policy; TRL's clipped surrogate has none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stare_lab.methods.registry import RuleOutput, RuleState, register
from stare_lab.methods.select import check_choice, check_common, check_fraction, select_top
from stare_lab.stats import TokenStats

VARIANTS = ("O1", "C2")


@dataclass(frozen=True)
class Params:
    variant: str = "O1"  # STARE §4: O1 (boost L+) is the default, C2 also damps L-
    P: float = 0.1  # STARE §4: fraction of T+ (T-) by surprisal
    W: float = 1.1  # STARE §4: weight on L+ (14B/32B: 1.05)
    M: float = 0.9  # STARE §4: weight on L- (C2; 14B/32B: 0.95)
    H_tgt: float = 0.3  # STARE §4.3: target entropy of the gate
    adaptive: bool = False  # STARE §4.4: adaptive W/M schedule (off by default)
    alpha: float = 0.01  # STARE §4.4: step of the adaptive schedule
    W_max: float = 1.5  # STARE §4.4
    M_min: float = 0.5  # STARE §4.4
    scope: str = "batch"  # [ours] the official code selects per micro-batch
    ties: str = "topk"
    normalize: str = "valid"  # STARE: not renormalised

    def __post_init__(self) -> None:
        check_common(self)
        check_choice("variant", self.variant, VARIANTS)
        check_fraction("P", self.P)
        if not self.W >= 1.0:
            raise ValueError(f"W={self.W} is out of range (W ≥ 1)")
        if not 0.0 <= self.M <= 1.0:
            raise ValueError(f"M={self.M} is out of range (0 ≤ M ≤ 1)")
        if not self.H_tgt >= 0.0:
            raise ValueError(f"H_tgt={self.H_tgt} is out of range (H_tgt ≥ 0)")
        if not self.alpha >= 0.0:
            raise ValueError(f"alpha={self.alpha} is out of range (alpha ≥ 0)")
        if not self.W_max >= 1.0:
            raise ValueError(f"W_max={self.W_max} is out of range (W_max ≥ 1)")
        if not 0.0 <= self.M_min <= 1.0:
            raise ValueError(f"M_min={self.M_min} is out of range (0 ≤ M_min ≤ 1)")
        if self.adaptive and not (self.W <= self.W_max and self.M >= self.M_min):
            raise ValueError(
                f"adaptive needs W ≤ W_max and M ≥ M_min, got W={self.W}, W_max={self.W_max}, "
                f"M={self.M}, M_min={self.M_min}"
            )


def adapt(memory: dict, entropy_mean: float, p: Params) -> tuple[float, float]:
    """Current (W, M); with `adaptive`, first step them by ±alpha toward the target entropy (note 4)."""
    if not p.adaptive:
        return p.W, p.M
    W, M = float(memory.get("W", p.W)), float(memory.get("M", p.M))
    if math.isfinite(entropy_mean):
        sign = float((p.H_tgt > entropy_mean) - (p.H_tgt < entropy_mean))
        W = min(max(W + p.alpha * sign, 1.0), p.W_max)
        M = min(max(M - p.alpha * sign, p.M_min), 1.0)
    memory["W"], memory["M"] = W, M
    return W, M


def gate_open(memory: dict, entropy_mean: float, p: Params) -> bool:
    """H̄ < H_tgt, remembered; a non-finite H̄ keeps the previous gate (note 7)."""
    if not math.isfinite(entropy_mean):
        return bool(memory.get("gate", True))
    memory["gate"] = bool(entropy_mean < p.H_tgt)
    return memory["gate"]


def step_needs(p: Params, trainer) -> frozenset[str]:
    """Scope microbatch: the gate's H̄ is the whole generation batch's (the official controller's)."""
    return frozenset({"entropy"}) if p.scope == "microbatch" else frozenset()


def controller(stats: TokenStats, state: RuleState, p: Params) -> tuple[float, float, bool, float]:
    """(W, M, gate, H̄) for this batch; scope microbatch: updated once per rule-state step from `step_stats`."""
    if p.scope == "microbatch":
        if state.step_stats is None:
            raise ValueError("stare with scope='microbatch' needs state.step_stats (the step's generation batch)")
        memory = state.memory
        if memory.get("step") == state.step:  # a later micro-batch of this step: the controller has run
            return float(memory.get("W", p.W)), float(memory.get("M", p.M)), bool(memory["gate"]), memory["H"]
        stats = state.step_stats
    entropy = stats.need("entropy", rule="stare")
    valid = stats.valid
    n_valid = int(valid.sum())
    entropy_mean = float(entropy[valid].double().sum()) / n_valid if n_valid else float("nan")
    W, M = adapt(state.memory, entropy_mean, p)
    gate = gate_open(state.memory, entropy_mean, p)
    if p.scope == "microbatch":
        state.memory.update(step=state.step, gate=gate, H=entropy_mean)
    return W, M, gate, entropy_mean


@register("stare", Params, needs={"logp", "entropy"}, step_needs=step_needs)
def stare(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    import torch  # deferred: rules load without torch (docs/design.md, "Fast refusals")

    W, M, gate, entropy_mean = controller(stats, state, p)
    valid = stats.valid
    n_valid = int(valid.sum())

    A = stats.token_advantages
    gen = state.generator("stare")
    l_plus = select_top(stats.surprisal, valid & (A > 0), stats.group, p.P, scope=p.scope, ties=p.ties, generator=gen)
    l_minus = torch.zeros_like(l_plus)
    if p.variant == "C2":
        l_minus = select_top(
            stats.surprisal, valid & (A < 0), stats.group, p.P, scope=p.scope, ties=p.ties, generator=gen
        )

    weights = stats.mask.float()
    if gate:  # W on L+, M on L−, 1 elsewhere (L+ and L− are disjoint: A > 0 and A < 0)
        weights = weights * torch.where(l_plus, W, torch.where(l_minus, M, 1.0))
    boosted = float(l_plus.sum()) / n_valid if (n_valid and gate) else 0.0
    metrics = {
        "rule/gate": float(gate),
        "rule/entropy_mean": entropy_mean,
        "rule/W": W,
        "rule/M": M,
        "rule/boosted_frac": boosted,
    }
    # closed gate: every valid token is trained with weight 1, so all of them are "selected" (None)
    return RuleOutput(
        weights=weights, normalize=p.normalize, metrics=metrics, selected=(l_plus | l_minus) if gate else None
    )
