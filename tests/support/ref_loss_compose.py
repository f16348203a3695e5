"""A slow loop reference of TRL 1.16's GRPO loss with token weights (the composition of docs/trl_parity.md); no tests
here.

Plain Python over rows and tokens, written from the documented composition, not from
stare_lab.training.trl_loss: the weights multiply each token's policy term after the loss type's term and
the off-policy mask and before the vLLM importance-sampling ratio; β·KL stays on every valid
token; "selected" replaces the policy term's token counts by weight sums; the entropy bonus is a
mean over the weighted tokens; the MoE aux loss is added for every rule.
"""

from __future__ import annotations

import math


def _clamp(x, lo=None, hi=None):
    if lo is not None:
        x = max(x, lo)
    if hi is not None:
        x = min(x, hi)
    return x


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _vespo_phi(trainer, adv, lr, valid, is_row):
    """TRL's gamma weight φ(w) of one row (w: the sequence importance ratio, with the vLLM ratio if any)."""
    a = trainer.args
    lower = math.log(1e-8)
    s = sum(_clamp(lr[k], -20.0, 20.0) for k in valid)
    if is_row is not None:  # TRL sums the log vLLM ratio over every position of the row
        s += sum(_clamp(math.log(x), lower, 20.0) for x in is_row)
    log_w = _clamp(s, lower, 20.0)
    k, lam = (a.vespo_k_pos, a.vespo_lambda_pos) if adv >= 0 else (a.vespo_k_neg, a.vespo_lambda_neg)
    lam = max(lam, 1e-4)
    phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
    return phi if math.isfinite(phi) else 0.0


def _policy_term(trainer, adv, ratio, logp, phi):
    a, lt = trainer.args, trainer.loss_type
    if lt == "cispo":
        return -min(ratio, trainer.epsilon_high) * adv * logp
    if lt == "sapo":
        tau = a.sapo_temperature_pos if adv > 0 else a.sapo_temperature_neg
        return -_sigmoid(tau * (ratio - 1)) * 4 / tau * adv
    if lt == "vespo":
        return -phi * adv * logp
    clipped = _clamp(ratio, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
    unclipped = ratio if a.delta is None else min(ratio, a.delta)
    return -min(unclipped * adv, clipped * adv)


def reference_loss(trainer, batch, logp, entropies, weights, normalize, aux_loss=None, mode="train"):
    """The scalar loss of one micro-batch. logp, entropies, weights: [B, T] tensors; batch: TRL's inputs."""
    lt, a = trainer.loss_type, trainer.args
    mask = batch["completion_mask"] * batch["tool_mask"] if "tool_mask" in batch else batch["completion_mask"]
    m, lp, H, w = mask.tolist(), logp.tolist(), entropies.tolist(), weights.float().tolist()
    old = batch["old_per_token_logps"].tolist() if batch.get("old_per_token_logps") is not None else lp
    sampling = batch["sampling_per_token_logps"].tolist() if "sampling_per_token_logps" in batch else old
    ref = batch["ref_per_token_logps"].tolist() if trainer.beta != 0.0 else None
    vllm = trainer.use_vllm and trainer.vllm_importance_sampling_correction
    is_ratio = batch["importance_sampling_ratio"].tolist() if "importance_sampling_ratio" in batch else None
    advantages = batch["advantages"].tolist()
    B, T = len(m), len(m[0])
    ga = trainer.current_gradient_accumulation_steps if mode == "train" else 1
    selected = normalize == "selected"

    policy, kl = [[0.0] * T for _ in range(B)], [[0.0] * T for _ in range(B)]
    for i in range(B):
        valid = [k for k in range(T) if m[i][k]]
        n, adv = len(valid), advantages[i]
        lr = [lp[i][k] - old[i][k] for k in range(T)]
        if trainer.importance_sampling_level == "sequence":
            ratios = [math.exp(sum(lr[k] for k in valid) / max(n, 1))] * T
        else:
            ratios = [math.exp(x) for x in lr]
        keep = 1.0
        if trainer.off_policy_mask_threshold is not None:
            mean_kl = sum(sampling[i][k] - lp[i][k] for k in valid) / max(n, 1)
            keep = 1.0 if adv >= 0 or mean_kl <= trainer.off_policy_mask_threshold else 0.0
        phi = _vespo_phi(trainer, adv, lr, valid, is_ratio[i] if is_ratio else None) if lt == "vespo" else None
        for k in range(T):
            term = _policy_term(trainer, adv, ratios[k], lp[i][k], phi) * keep * w[i][k]
            if vllm and lt != "vespo":
                term *= is_ratio[i][k] if len(is_ratio[i]) == T else is_ratio[i][0]
            policy[i][k] = term
            if ref is not None:
                d = ref[i][k] - lp[i][k]
                kl[i][k] = math.exp(d) - d - 1
                if a.use_bias_correction_kl:
                    kl[i][k] *= ratios[k]

    def counts(row):
        return sum(m[row]), sum(w[row][k] * m[row][k] for k in range(T))

    def aggregate(per_token, weighted_denominator):
        """The loss type's aggregation; weighted_denominator: weight sums replace token counts."""

        def den(x, total_weight):
            return (total_weight if total_weight > 0 else 1.0) if weighted_denominator else max(x, 1.0)

        if lt in ("grpo", "sapo"):
            rows = [sum(per_token[i][k] * m[i][k] for k in range(T)) / den(*counts(i)) for i in range(B)]
            return sum(rows) / B / ga
        total = sum(per_token[i][k] * m[i][k] for i in range(B) for k in range(T))
        if lt == "bnpo":
            all_counts = [counts(i) for i in range(B)]
            return total / den(sum(c for c, _ in all_counts), sum(s for _, s in all_counts)) / ga
        if lt == "dr_grpo":
            return total / (B * trainer.max_completion_length) / ga
        if lt == "luspo":
            return total / B / ga
        # dapo, cispo, vespo: the generation batch's count, rescaled to one accumulation window
        window = ga / a.steps_per_generation if mode == "train" else 1.0
        n_items, w_total = float(batch["num_items_in_batch"]), float(batch["token_weight_total"])
        return total / (den(n_items, w_total) / trainer.accelerator.num_processes * window)

    no_token_denominator = lt in ("dr_grpo", "luspo")
    loss = aggregate(policy, selected and not no_token_denominator)
    if ref is not None:
        loss += trainer.beta * aggregate(kl, False)
    if trainer._entropy_bonus_enabled:
        slot = _selected_slot(trainer, batch, m, w) if selected else w
        eff = [[m[i][k] * slot[i][k] for k in range(T)] for i in range(B)]
        total_eff = sum(map(sum, eff))
        bonus = sum(H[i][k] * eff[i][k] for i in range(B) for k in range(T)) / max(total_eff, 1.0) / ga
        coef = trainer.entropy_coef
        if trainer.use_adaptive_entropy and trainer._last_world_entropy > a.entropy_target:
            coef = 0.0
        loss -= coef * bonus
    if aux_loss is not None:
        loss += trainer.router_aux_loss_coef * float(aux_loss) / ga
    return loss


def _selected_slot(trainer, batch, m, w):
    """The weights as TRL's slot carries them under "selected": w × count / weight sum of the denominator's scope."""
    lt = trainer.loss_type
    B, T = len(m), len(m[0])

    def factor(count, total):
        return max(count, 1.0) / total if total > 0 else 0.0

    if lt in ("grpo", "sapo"):
        scale = [factor(sum(m[i]), sum(w[i][k] * m[i][k] for k in range(T))) for i in range(B)]
    elif lt == "bnpo":
        s = factor(sum(map(sum, m)), sum(w[i][k] * m[i][k] for i in range(B) for k in range(T)))
        scale = [s] * B
    elif lt in ("dapo", "cispo", "vespo"):
        scale = [factor(float(batch["num_items_in_batch"]), float(batch["token_weight_total"]))] * B
    else:
        scale = [1.0] * B
    return [[w[i][k] * scale[i] for k in range(T)] for i in range(B)]
