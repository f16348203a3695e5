# Ported for tests from zhyang2226/AR-Lopti @ cbeb333376decdfe571fa8613bdebcfcc526628d
#   verl/utils/torch_functional.py: masked_mean
#   verl/trainer/ppo/core_algos.py: agg_loss, compute_policy_loss
#   verl/trainer/ppo/ray_trainer.py: compute_reweight_advantage (lines 318-406), and the seperate_updating block of
#     RayPPOTrainer.fit (lines 1262-1301), wrapped in update_actor_separately (re-indented, otherwise as is)
# Licence: Apache-2.0 (LICENSE; Copyright 2024 Bytedance Ltd. and/or its affiliates).
# Unmodified except imports and that wrapper: verl_F is this module's masked_mean.
# ruff: noqa
# fmt: off
import types

import torch

def masked_mean(values, mask, axis=None):
    """Compute mean of tensor with a masked values."""
    return (values * mask).sum(axis=axis) / mask.sum(axis=axis)


verl_F = types.SimpleNamespace(masked_mean=masked_mean)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str):
    """
    Aggregate the loss matrix into a scalar.
    Args:
        loss_mat: `(torch.Tensor)`
            shape: (bs, response_length)
        loss_mask: `(torch.Tensor)`
            shape: (bs, response_length)
        loss_agg_mode: (str) choices: "token-mean" / "seq-mean-token-sum" / "seq-mean-token-mean"
            "token-mean" is the default behavior
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
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")

    return loss

def compute_policy_loss(old_log_prob,
                        log_prob,
                        advantages,
                        response_mask,
                        cliprange=None,
                        cliprange_low=None,
                        cliprange_high=None,
                        clip_ratio_c=3.0,
                        loss_agg_mode="token-mean"):
    """Adapted from https://github.com/huggingface/trl/blob/main/trl/trainer/ppo_trainer.py#L1122
    Args:
        old_log_prob: `(torch.Tensor)`
            shape: (bs, response_length)
        log_prob: `(torch.Tensor)`
            shape: (bs, response_length)
        advantages: `(torch.Tensor)`
            shape: (bs, response_length)
        response_mask: `(torch.Tensor)`
            shape: (bs, response_length)
        cliprange: (float)
            The clip range used in PPO. See https://arxiv.org/abs/1707.06347
        cliprange_low: (float)
            The lower clip range used in PPO.
        cliprange_high: (float)
            The higher clip range used in PPO.
        clip_ratio_c: (float) default: 3.0
            The lower bound of the ratio for dual-clip PPO, See https://arxiv.org/pdf/1912.09729
        loss_agg_mode: (str) choices: "token-mean" / "seq-mean-token-sum" / "seq-mean-token-mean"
            "token-mean" is the default behavior        

    Returns:
        pg_loss: `a scalar torch.Tensor`
            policy gradient loss computed via PPO
        pg_clipfrac: (float)
            the fraction of policy gradient loss being clipped
        ppo_kl: (float)
            the estimated KL divergence between the latest updating policy and the old sampling policy
        pg_clipfrac_lower: (float)
            the fraction of policy gradient loss being clipped when the advantage is negative
    """
    assert clip_ratio_c > 1.0, f"The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0, but get the value: {clip_ratio_c}."

    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = verl_F.masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    if cliprange_low is None:
        cliprange_low = cliprange
    if cliprange_high is None:
        cliprange_high = cliprange
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low,
                                           1 + cliprange_high)  # - clip(ratio, 1-cliprange, 1+cliprange) * A
    clip_pg_losses1 = torch.maximum(pg_losses1,
                                    pg_losses2)  # max(-ratio * A, -clip(ratio, 1-cliprange, 1+cliprange) * A)
    pg_clipfrac = verl_F.masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_F.masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask)

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)

    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower

def compute_reweight_advantage(advantage, log_prob, reweight_method, reweight_k, reweight_tau, neg_adv_weight):
    if "negative_sigmoid" in reweight_method:
        # reweight negative advantage
        reweight_advantage = 2 * torch.sigmoid(reweight_k * (torch.exp(log_prob) - reweight_tau)) * advantage
        neg_advantage = torch.where(advantage > 0, 0.0, reweight_advantage)
        pos_advantage = torch.where(advantage > 0, advantage, 0.0)

        # TODO re-Balance the advantage 
        # * Method1 Balance adv*prob
        if "balance1" in reweight_method:
            pos_adv_sum = torch.sum(pos_advantage * torch.exp(log_prob))
            neg_adv_sum = - torch.sum(neg_advantage * torch.exp(log_prob))
            neg_advantage *= pos_adv_sum / neg_adv_sum
            neg_advantage *= neg_adv_weight
        
        reweight_advantage = pos_advantage + neg_advantage
        # re-Balance the advantage 
    
    elif "both_sigmoid" in reweight_method:
        reweight_advantage = 2 * torch.sigmoid(reweight_k * (torch.exp(log_prob) - reweight_tau)) * advantage
        neg_advantage = torch.where(advantage > 0, 0.0, reweight_advantage)
        pos_advantage = torch.where(advantage > 0, reweight_advantage, 0.0)
        if "balance1" in reweight_method:
            pos_adv_sum = torch.sum(pos_advantage * torch.exp(log_prob))
            neg_adv_sum = - torch.sum(neg_advantage * torch.exp(log_prob))
            # neg_advantage *= pos_adv_sum / neg_adv_sum
            neg_advantage *= neg_adv_weight
            reweight_advantage = pos_advantage + neg_advantage
    
    elif "both_linear" in reweight_method: # reweight_advantage = reweight_k * prob + reweight_tau
        reweight_advantage = (reweight_k * torch.exp(log_prob) + reweight_tau) * advantage
        neg_advantage = torch.where(advantage > 0, 0.0, reweight_advantage)
        pos_advantage = torch.where(advantage > 0, reweight_advantage, 0.0)
        if "normal" in reweight_method:
            neg_advantage *= neg_adv_weight
            reweight_advantage = pos_advantage + neg_advantage
        elif "balance1" in reweight_method: # only reweight positive samples
            neg_advantage = torch.where(advantage > 0, 0.0, advantage)
            neg_advantage *= neg_adv_weight
            reweight_advantage = pos_advantage + neg_advantage
    
    elif "mask_prob" in reweight_method:
        # interval = [0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]
        interval = [0, 0.25, 0.5, 0.75, 1.0]
        if "interval1" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > interval[0], 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= interval[1], 1.0, 0.0)
        elif "interval2" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > interval[1], 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= interval[2], 1.0, 0.0)
        elif "interval3" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > interval[2], 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= interval[3], 1.0, 0.0)
        elif "interval4" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > interval[3], 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= interval[4], 1.0, 0.0)
        elif "interval5" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > interval[4], 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= interval[5], 1.0, 0.0)
        elif "interval6" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > interval[5], 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= interval[6], 1.0, 0.0)
        elif "interval7" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > interval[6], 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= interval[7], 1.0, 0.0)
        elif "interval8" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > interval[7], 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= interval[8], 1.0, 0.0)
        elif "lower0.25" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > 0, 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= 0.25, 1.0, 0.0)
        elif "lower0.5" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > 0, 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= 0.5, 1.0, 0.0)
        elif "lower0.75" in reweight_method:
            mask1 = torch.where(torch.exp(log_prob) > 0, 1.0, 0.0)
            mask2 = torch.where(torch.exp(log_prob) <= 0.75, 1.0, 0.0)
        else:
            raise NotImplementedError(f"Reweight method {reweight_method} is not supported.")
        mask = mask1 * mask2
        reweight_advantage = advantage * mask
    elif "RAFT" in reweight_method:
        reweight_advantage = torch.where(advantage > 0, 1.0, 0.0)
        if "linear" in reweight_method:
            reweight_advantage = (reweight_k * torch.exp(log_prob) + reweight_tau) * reweight_advantage
    else:
        raise NotImplementedError(f"Reweight method {reweight_method} is not supported.")
    
    return reweight_advantage


def update_actor_separately(self, batch):
    """RayPPOTrainer.fit, the actor update: self.actor_rollout_wg.update_actor(batch) is the caller's."""
    seperate_record_dict = {"actor/sep_prob": 0.0, "actor/sep_portion": 0.0}
    response_length = batch.batch['responses'].size(1)
    if self.config.algorithm.seperate_updating:
        updating_advantage = torch.clone(batch.batch['advantages'])
        batch.batch['kl_entropy_mask'] = torch.clone(batch.batch['attention_mask'])
        # * update first time
        if self.config.algorithm.seperate_prob != 0.0: #  ~ Prob Threshold Method
            if self.config.algorithm.seperate_prob > 0: # updating low_prob tokens first
                indication = torch.exp(batch.batch['old_log_probs']) < self.config.algorithm.seperate_prob
            else:
                indication = torch.exp(batch.batch['old_log_probs']) >= -self.config.algorithm.seperate_prob
            seperate_record_dict["actor/sep_prob"] = abs(self.config.algorithm.seperate_prob)
            seperate_record_dict["actor/sep_portion"] = (torch.sum(indication)/torch.sum(batch.batch['attention_mask'][:, -response_length:])).item()
        else: #  ~ Prob Portion Method, only activated when self.config.algorithm.seperate_prob == 0
            real_probs = torch.exp(batch.batch['old_log_probs']) * batch.batch['attention_mask'][:, -response_length:]
            real_probs = real_probs[real_probs > 0]
            if self.config.algorithm.seperate_portion > 0: # filter out zero probs
                sep_prob_with_portion = torch.quantile(real_probs, self.config.algorithm.seperate_portion, dim=0, keepdim=True)
                indication = torch.exp(batch.batch['old_log_probs']) < sep_prob_with_portion
            else:
                sep_prob_with_portion = torch.quantile(real_probs, -self.config.algorithm.seperate_portion, dim=0, keepdim=True)
                indication = torch.exp(batch.batch['old_log_probs']) >= sep_prob_with_portion
            seperate_record_dict["actor/sep_prob"] = sep_prob_with_portion.item()
            seperate_record_dict["actor/sep_portion"] = abs(self.config.algorithm.seperate_portion)
        
        batch.batch['advantages'] = torch.where(indication, updating_advantage, 0.0)
        batch.batch['kl_entropy_mask'][:, -response_length:] = torch.where(indication, batch.batch['attention_mask'][:, -response_length:], 0)
        actor_output = self.actor_rollout_wg.update_actor(batch)
        # * update second time
        batch.batch['advantages'] = torch.where(indication, 0.0, updating_advantage)
        batch.batch['kl_entropy_mask'][:, -response_length:] = torch.where(indication, 0, batch.batch['attention_mask'][:, -response_length:])
        actor_output_new = self.actor_rollout_wg.update_actor(batch)
        # * merge two actor_output
        for key in actor_output.meta_info['metrics']:
            if isinstance(actor_output.meta_info['metrics'][key], float):
                actor_output.meta_info['metrics'][key] = (actor_output.meta_info['metrics'][key] + actor_output_new.meta_info['metrics'][key]) / 2
            elif isinstance(actor_output.meta_info['metrics'][key], list):
                actor_output.meta_info['metrics'][key] = actor_output.meta_info['metrics'][key] + actor_output_new.meta_info['metrics'][key]
        # * recover the original batch
        batch.batch['advantages'] = updating_advantage
    return seperate_record_dict
