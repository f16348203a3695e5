"""The set-up of the micro-batch scope tests, written once: the built-in model and task (`setup`
fixture), a trainer whose generation batches TRL splits into GA micro-batches (`microbatch_trainer`),
a run recorded micro-batch by micro-batch (`record_micro_batches`: the inputs, the training forward's
log-probs and entropies, ∂loss/∂logp), and the check of every micro-batch against an official code's
reference (`check_run`, with verl's token-mean denominator `verl_denominator`).

Used by tests/training/test_microbatch_official.py and tests/methods/test_field_matched_control.py.
"""

from __future__ import annotations

import copy
import zlib

import pytest
import torch
from dist_worker_train import rollout_func  # completions of 2-6 tokens (see microbatch_trainer)
from fixtures_trainer import grpo_config, trainer_kwargs
from transformers import Qwen2ForCausalLM

from stare_lab.models.builtin import BUILTIN_DIR, build_tokenizer
from stare_lab.tasks.arithmetic import ArithmeticTask
from stare_lab.training.trainer import TokenRuleGRPOTrainer

G, TAU, GA = 4, 0.8, 2


def length_reward(completions, **kwargs):
    """Varies within groups even when every completion runs to the length limit."""
    return [float(zlib.crc32(c.encode()) % 7) for c in completions]


@pytest.fixture(scope="module")
def setup():
    return (
        build_tokenizer(),
        Qwen2ForCausalLM.from_pretrained(BUILTIN_DIR),
        ArithmeticTask(train_size=96, heldout_size=8),
    )


def microbatch_trainer(setup, tmp_path, rule, steps=3, **kw):
    """A trainer of `rule` whose rollouts are completions of 2-6 tokens (EOS-ended, dist_worker_train's
    rollout_func), so micro-batches hold unequal token counts and the aggregations differ (the built-in
    model's own samples at this length all run to the limit)."""
    tok, model, task = setup
    trainer_kw = {k: kw.pop(k) for k in ("microbatch_aggregation", "microbatch_ranks") if k in kw}
    args = grpo_config(
        tmp_path,
        **{
            "per_device_train_batch_size": 4,
            "num_generations": G,
            "gradient_accumulation_steps": GA,
            "max_completion_length": 6,
            "max_steps": steps,
            "learning_rate": 1e-2,
            "temperature": TAU,
            **kw,
        },
    )
    kwargs = trainer_kwargs(tok, copy.deepcopy(model), args, task.train_dataset(), reward=length_reward)
    return TokenRuleGRPOTrainer(**kwargs, rule=rule, rollout_func=rollout_func, **trainer_kw)


def plain_entropy(model, batch):
    """[B, T] entropy of softmax(logits/τ) at completion positions: the official old-log-prob pass."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    T = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -T - 1 : -1].float() / TAU
    logp = logits.log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def record_micro_batches(trainer):
    """Run the trainer; per step: H̄ of the generation batch (a plain forward of the rollout policy) and, per
    micro-batch, its inputs, the forward's logp and entropies, the loss inputs, ∂loss/∂logp and the steps."""
    steps, forward = [], {}
    generate, logps, compute = (
        trainer._generate_and_score_completions,
        trainer._get_per_token_logps_and_entropies,
        trainer._compute_loss,
    )

    def generated(inputs):
        out = generate(inputs)
        H = plain_entropy(trainer.model, out)
        m = out["completion_mask"].bool()
        steps.append({"H": float(H[m].double().sum() / m.sum()), "micro": []})
        return out

    def forward_kept(*args, **kwargs):
        out = logps(*args, **kwargs)
        if torch.is_grad_enabled():
            forward.update(logp=out[0], entropies=out[1])
        return out

    def loss_recorded(model, inputs):
        loss = compute(model, inputs)
        (grad,) = torch.autograd.grad(loss, forward["logp"], retain_graph=True)
        steps[-1]["micro"].append(
            {
                "inputs": {k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)},
                "logp": forward["logp"].detach().clone(),
                "entropy": forward["entropies"].detach().clone(),
                "grad": grad,
                "memory": dict(trainer.rule_state.memory),
                "steps": (trainer.state.global_step, trainer.rule_state.step),
            }
        )
        return loss

    trainer._generate_and_score_completions = generated
    trainer._get_per_token_logps_and_entropies = forward_kept
    trainer._compute_loss = loss_recorded
    trainer.train()
    return steps


def assert_same_selection(ours, ref, score, mask):
    """Equal weights; or, where a tie was broken differently, the same count and multiset of scores per weight."""
    valid = mask > 0
    assert bool((ours[~valid] == 0).all()), "weights are 0 on padding"
    if torch.equal(ours[valid], ref[valid]):
        return
    for value in torch.unique(torch.cat([ours[valid], ref[valid]])):
        a, b = (ours == value) & valid, (ref == value) & valid
        assert int(a.sum()) == int(b.sum()), f"count of weight {value}"
        assert torch.equal(torch.sort(score[a]).values, torch.sort(score[b]).values), f"scores of weight {value}"


def check_run(steps, reference, denominator):
    """Every micro-batch: weights as the official code's (reference(micro, step) -> (weights, counted)),
    and ∂loss/∂logp = −A·w·m / denominator(micro, counted) (on policy)."""
    n = 0
    for k, step in enumerate(steps):
        for micro in step["micro"]:
            inputs = micro["inputs"]
            mask = inputs["completion_mask"].float()
            ref_w, counted = reference(micro, k)
            ours = inputs["token_weights"]
            score = micro["entropy"] if reference.score == "entropy" else -micro["logp"]
            assert_same_selection(ours, ref_w, score, mask)
            expected = -inputs["advantages"][:, None] * ours * mask / denominator(micro, (counted * mask).sum())
            torch.testing.assert_close(micro["grad"], expected, rtol=1e-5, atol=1e-9)
            n += 1
    assert n == sum(len(s["micro"]) for s in steps) and n >= 2 * len(steps)


def verl_denominator(micro, count):
    return count * GA  # token mean of the micro-batch × its share 1/GA of the step's rows
