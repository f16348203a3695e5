# Ported for tests from wizard-III/ArcherCodeR @ 8a1785beff0749a5b5b7f3d8751cd19c1d0e570a
#   verl/utils/torch_functional.py: masked_mean
#   verl/trainer/ppo/core_algos.py: agg_loss, compute_policy_loss, kl_penalty
#   verl/workers/actor/dp_actor.py: DataParallelPPOActor.update_policy, the body of the micro-batch loop
#     from the response mask to the KL term (lines 378-456), wrapped in micro_batch_policy_loss
#     (re-indented, otherwise as is; it returns policy_loss before the gradient-accumulation scaling)
# Licence: MIT (LICENSE: Copyright (c) 2025 Alan); the verl parts Apache-2.0 (Bytedance Ltd.).
# Unmodified except imports and that wrapper: verl_F is this module's masked_mean; the wrapper's
# self stands in for the actor (config with attributes and .get, _forward_micro_batch).
# ruff: noqa
# fmt: off
import types

import torch

def masked_mean(values, mask, axis=None):
    """
    Compute the mean of `values` over elements selected by `mask`.

    Args:
        values (Tensor): Input tensor.
        mask (Tensor): Boolean or numeric mask of the same shape as `values`.
        axis (int or tuple of int, optional): Dimension(s) along which to compute the mean.
            Defaults to None (over all elements).

    Returns:
        Tensor: Masked mean, with shape equal to `values` reduced over `axis`.
    """
    return (values * mask).sum(axis=axis) / (mask.sum(axis=axis) + 1e-8)


verl_F = types.SimpleNamespace(masked_mean=masked_mean)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str):
    """
    Aggregate the loss matrix into a scalar.

    Args:
        loss_mat: `(torch.Tensor)`:
            shape: (bs, response_length)
        loss_mask: `(torch.Tensor)`:
            shape: (bs, response_length)
        loss_agg_mode: (str) choices:
            method to aggregate the loss matrix into a scalar.
    Returns:
        loss: `a scalar torch.Tensor`
            aggregated loss
    """
    if loss_agg_mode == "token-mean":
        loss = verl_F.masked_mean(loss_mat, loss_mask)
    elif loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)  # token-sum
        loss = torch.mean(seq_losses)  # seq-mean
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / torch.sum(loss_mask, dim=-1)  # token-mean
        loss = torch.mean(seq_losses)  # seq-mean
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        loss = torch.sum(seq_losses) / loss_mask.shape[-1]  # The divisor
        # (loss_mask.shape[-1]) should ideally be constant
        # throughout training to well-replicate the DrGRPO paper.
        # TODO: Perhaps add user-defined normalizer argument to
        # agg_loss to ensure divisor stays constant throughout.
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")

    return loss


def compute_policy_loss(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    use_token_entropy_separate=False,
    high_entropy_mask=None,
    cliprange=None,
    cliprange_low=None,
    cliprange_high=None,
    low_entropy_clip_ratio_low=None,
    low_entropy_clip_ratio_high=None,
    high_entropy_clip_ratio_low=None,
    high_entropy_clip_ratio_high=None,
    clip_ratio_c=3.0,
    loss_agg_mode: str = "token-mean",
):
    """
    Compute the clipped policy objective and related metrics for PPO.

    Adapted from
    https://github.com/huggingface/trl/blob/main/trl/trainer/ppo_trainer.py#L1122

    Args:
        old_log_prob (torch.Tensor):
            Log-probabilities of actions under the old policy, shape (batch_size, response_length).
        log_prob (torch.Tensor):
            Log-probabilities of actions under the current policy, shape (batch_size, response_length).
        advantages (torch.Tensor):
            Advantage estimates for each action, shape (batch_size, response_length).
        response_mask (torch.Tensor):
            Mask indicating which tokens to include in the loss, shape (batch_size, response_length).
        cliprange (float, optional):
            Clipping parameter ε for standard PPO. See https://arxiv.org/abs/1707.06347.
            Defaults to None (must be provided).
        cliprange_low (float, optional):
            Lower clip range for dual-clip PPO. Defaults to same as `cliprange`.
        cliprange_high (float, optional):
            Upper clip range for dual-clip PPO. Defaults to same as `cliprange`.
        clip_ratio_c (float, optional):
            Lower bound of the ratio for dual-clip PPO. See https://arxiv.org/pdf/1912.09729.
            Defaults to 3.0.
        loss_agg_mode (str, optional):
            Aggregation mode for `agg_loss`. Defaults to "token-mean".
    """
    assert clip_ratio_c > 1.0, "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0," + f" but get the value: {clip_ratio_c}."

    negative_approx_kl = log_prob - old_log_prob
    # Clamp negative_approx_kl for stability
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = verl_F.masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio

    if cliprange_low is None:
        cliprange_low = cliprange
    if cliprange_high is None:
        cliprange_high = cliprange

    if use_token_entropy_separate:
        # select cliprange_low or cliprange_high according to high_entropy_mask
        clip_ratio = torch.where(high_entropy_mask.bool(), torch.clamp(ratio, 1 - low_entropy_clip_ratio_low, 1 + low_entropy_clip_ratio_high), torch.clamp(ratio, 1 - high_entropy_clip_ratio_low, 1 + high_entropy_clip_ratio_high))
        pg_losses2 = -advantages * clip_ratio
    else:
        pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)  # - clip(ratio, 1-cliprange, 1+cliprange) * A

    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)  # max(-ratio * A, -clip(ratio, 1-cliprange, 1+cliprange) * A)
    pg_clipfrac = verl_F.masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c

    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_F.masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask)

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)

    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def kl_penalty(logprob: torch.FloatTensor, ref_logprob: torch.FloatTensor, kl_penalty) -> torch.FloatTensor:
    """Compute KL divergence given logprob and ref_logprob.
    Copied from https://github.com/huggingface/trl/blob/main/trl/trainer/ppo_trainer.py#L1104
    See more description in http://joschu.net/blog/kl-approx.html

    Args:
        logprob:
        ref_logprob:

    Returns:

    """
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob

    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()

    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()

    # J. Schulman. Approximating kl divergence, 2020.
    # # URL http://joschu.net/blog/kl-approx.html.
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        # For numerical stability
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)

    if kl_penalty == "full":
        # so, here logprob and ref_logprob should contain the logits for every token in vocabulary
        raise NotImplementedError

    raise NotImplementedError


def micro_batch_policy_loss(self, data, temperature, multi_turn=False):
    metrics = {}
    responses = data["responses"]
    response_length = responses.size(1)
    attention_mask = data["attention_mask"]
    if multi_turn:
        response_mask = data["loss_mask"][:, -response_length:]
    else:
        response_mask = attention_mask[:, -response_length:]

    old_log_prob = data["old_log_probs"]
    advantages = data["advantages"]

    clip_ratio = self.config.clip_ratio
    clip_ratio_low = self.config.clip_ratio_low if self.config.clip_ratio_low is not None else clip_ratio
    clip_ratio_high = self.config.clip_ratio_high if self.config.clip_ratio_high is not None else clip_ratio
    clip_ratio_c = self.config.get("clip_ratio_c", 3.0)
    entropy_coeff = self.config.entropy_coeff
    loss_agg_mode = self.config.loss_agg_mode

    # all return: (bsz, response_length)
    calculate_entropy = True
    # if entropy_coeff != 0:
    #     calculate_entropy = True
    entropy, log_prob = self._forward_micro_batch(micro_batch=data, temperature=temperature, calculate_entropy=calculate_entropy)

    # high entropy token mask
    high_entropy_mask, low_entropy_mask = None, None
    if self.config.get("use_token_entropy_separate", False):
        with torch.no_grad():
            token_entropy_quantile = self.config.get("token_entropy_quantile", 0.8)
            masked_entropy = torch.where(response_mask.bool(), entropy.detach(), torch.nan)  # (bsz, response_length)
            q80 = torch.nanquantile(masked_entropy, q=token_entropy_quantile, dim=-1, keepdim=True)  # (bsz, 1)
            high_entropy_mask = (masked_entropy <= q80) & response_mask # only low entropy token is True
            low_entropy_mask = (masked_entropy > q80) & response_mask #  only high entropy token is True

    pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = compute_policy_loss(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        use_token_entropy_separate=self.config.get("use_token_entropy_separate", False),
        high_entropy_mask=high_entropy_mask,
        cliprange=clip_ratio,
        cliprange_low=clip_ratio_low,
        cliprange_high=clip_ratio_high,
        low_entropy_clip_ratio_low=self.config.get("low_entropy_clip_ratio_low", clip_ratio_low),
        low_entropy_clip_ratio_high=self.config.get("low_entropy_clip_ratio_high", clip_ratio_low),
        high_entropy_clip_ratio_low=self.config.get("high_entropy_clip_ratio_low", clip_ratio_high),
        high_entropy_clip_ratio_high=self.config.get("high_entropy_clip_ratio_high", clip_ratio_high),
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
    )

    if entropy_coeff != 0:
        entropy_loss = agg_loss(loss_mat=entropy, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)

        # compute policy loss
        policy_loss = pg_loss - entropy_loss * entropy_coeff
    else:
        policy_loss = pg_loss

    if self.config.use_kl_loss:
        ref_log_prob = data["ref_log_prob"]
        # compute kl loss
        kld = kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=self.config.kl_loss_type)
        if self.config.use_token_entropy_separate:
            low_entropy_kl_loss = agg_loss(loss_mat=kld, loss_mask=high_entropy_mask, loss_agg_mode=loss_agg_mode)
            high_entropy_kl_loss = agg_loss(loss_mat=kld, loss_mask=low_entropy_mask, loss_agg_mode=loss_agg_mode)
            kl_loss = low_entropy_kl_loss + high_entropy_kl_loss
            policy_loss = policy_loss + low_entropy_kl_loss * self.config.kl_loss_coef + high_entropy_kl_loss * self.config.high_entropy_kl_loss_scale_coef
        else:
            kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
            policy_loss = policy_loss + kl_loss * self.config.kl_loss_coef

        metrics["actor/kl_loss"] = kl_loss.detach().item()
        metrics["actor/kl_coef"] = self.config.kl_loss_coef
        if self.config.use_token_entropy_separate:
            metrics["actor/low_entropy_kl_loss"] = low_entropy_kl_loss.detach().item()
            metrics["actor/high_entropy_kl_loss"] = high_entropy_kl_loss.detach().item()
            metrics["actor/high_entropy_kl_loss_scale_coef"] = self.config.high_entropy_kl_loss_scale_coef
    return policy_loss, pg_loss, metrics
