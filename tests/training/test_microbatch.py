"""scope "microbatch" (stare_lab/training/token_weights.py): selection inside the loss from the training forward.

- Against a loop reference: inside a real training run (2 micro-batches per generation batch), each
  micro-batch's weights equal the rule with scope "batch" applied to that micro-batch alone, with
  entropies of the current policy from a plain forward (model(...).logits / τ) at that moment.
- With one micro-batch holding the generation batch, scope "microbatch" equals scope "batch".
- STARE with scope microbatch trains (parameters move, its controller runs once per step); a rule
  that reads what the loss forward does not give is refused in one line.
The shipped trained model: entropies without near-ties that float noise could flip.
"""

from __future__ import annotations

import copy
import zlib

import pytest
import torch
from fixtures_trainer import builtin_lm, grpo_config, rule_trainer, tiny_lm
from microbatch_support import TAU, G, plain_entropy  # plain_entropy: softmax(logits/TAU)

from stare_lab.methods import RuleState, get_method
from stare_lab.stats import TokenStats
from stare_lab.tasks.arithmetic import ArithmeticTask


def length_reward(completions, **kwargs):
    """Varies within groups even when every completion runs to the length limit."""
    return [float(zlib.crc32(c.encode()) % 7) for c in completions]


@pytest.fixture(scope="module")
def setup():
    return (*builtin_lm(), ArithmeticTask(train_size=64, heldout_size=8))


@pytest.fixture(scope="module")
def spread_setup():
    """A tiny random model: entropies spread over a range, far above float32's noise. The built-in
    testbed is sure of most tokens (entropies of 1e-7 to 1e-5 nats: docs/demo.md, "The testbed"), where
    the generation's and the loss forward's entropies (two kernels) order the bottom 80% differently by
    their last bits; scope `batch` and scope `microbatch` then agree only up to those ties."""
    return (*tiny_lm(), ArithmeticTask(train_size=64, heldout_size=8))


def _trainer(setup, tmp_path, rule, **kw):
    tok, model, task = setup
    args = grpo_config(
        tmp_path,
        **{
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "max_completion_length": 16,
            "learning_rate": 1e-2,
            "temperature": TAU,
            **kw,
        },
    )
    return rule_trainer(tok, copy.deepcopy(model), args, task.train_dataset(), rule, length_reward)


def test_microbatch_equals_a_loop_reference_per_micro_batch(setup, tmp_path):
    trainer = _trainer(setup, tmp_path, get_method("top_entropy", scope="microbatch", rho=0.3))
    weights_fn, seen = trainer._microbatch_weights, []

    def spy(inputs, entropies, logp):
        reference_entropy = plain_entropy(trainer.model, inputs)  # the current policy, right now
        result = weights_fn(inputs, entropies, logp)
        seen.append(
            (
                reference_entropy,
                {k: v.clone() if torch.is_tensor(v) else v for k, v in {**inputs, **result}.items()},
                trainer.rule_state.step,
            )
        )
        return result

    trainer._microbatch_weights = spy
    trainer.train()
    assert len(seen) == 2 * 2, "2 optimizer steps × 2 micro-batches"
    reference_rule = get_method("top_entropy", scope="batch", rho=0.3)
    for entropy, inputs, step in seen:
        mask = inputs["completion_mask"]
        B = mask.size(0)
        stats = TokenStats(
            logp=torch.full(mask.shape, float("nan")),
            mask=mask,
            advantages=inputs["advantages"],
            group=torch.arange(B),
            entropy=entropy,
        )
        expected = reference_rule(stats, RuleState(step=step, seed=0)).weights
        assert 0 < int(expected.sum()) < int(mask.sum())
        assert torch.equal(inputs["token_weights"], expected)
        assert inputs["token_weight_total"].item() == expected.sum().item() * trainer.args.steps_per_generation


@pytest.mark.parametrize(
    "name,params", [("top_entropy", {"rho": 0.3}), ("stare", {"H_tgt": 10.0}), ("low_entropy", {})]
)
def test_one_micro_batch_holding_the_batch_equals_scope_batch(spread_setup, tmp_path, name, params):
    setup = spread_setup
    batch_scope = _trainer(
        setup, tmp_path, get_method(name, **params), per_device_train_batch_size=8, gradient_accumulation_steps=1
    )
    micro = _trainer(
        setup,
        tmp_path,
        get_method(name, scope="microbatch", **params),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
    )
    # STARE reads its gate's H̄ once per step from the generation batch (recorded while sampling)
    assert micro.stats_source() == ("generation" if name == "stare" else "microbatch")
    assert micro.args.steps_per_generation == 1
    ds = batch_scope.train_dataset
    rows = [ds[i] for i in range(2) for _ in range(G)]
    outs = []
    for t in (batch_scope, micro):
        t.model.train()
        torch.manual_seed(1)
        outs.append(t._generate_and_score_completions(rows))
    ref, out = outs
    assert bool(out["token_weights"].isnan().all()), "placeholders until the loss"
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    mask = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    with torch.no_grad():  # the loss forward's own statistics (TRL's fused head), here without grad
        logp, entropies, _ = micro._get_per_token_logps_and_entropies(
            micro.model, ids, mask, ids.size(1) - out["prompt_ids"].size(1), compute_entropy=True
        )
    out.update(micro._microbatch_weights(out, entropies, logp))
    assert not torch.equal(ref["token_selected"], ref["completion_mask"].float()), "the rule must select"
    assert torch.equal(out["token_weights"], ref["token_weights"])
    assert torch.equal(out["token_selected"], ref["token_selected"])
    assert torch.equal(out["token_normalize"], ref["token_normalize"])
    assert out["token_weight_total"].item() == ref["token_weight_total"].item()
    for key, value in batch_scope.rule_state.memory.items():  # e.g. STARE's W, M, gate
        assert micro.rule_state.memory[key] == value


def test_stare_microbatch_trains_and_runs_its_controller_once_per_step(setup, tmp_path):
    trainer = _trainer(setup, tmp_path, get_method("stare", scope="microbatch"))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    calls = []
    weights_fn = trainer._microbatch_weights
    trainer._microbatch_weights = lambda *a: (calls.append(1), weights_fn(*a))[1]
    trainer.train()
    assert len(calls) == 4
    assert max((p - q).abs().max().item() for p, q in zip(trainer.model.parameters(), before, strict=True)) > 0
    assert "gate" in trainer.rule_state.memory and trainer.rule_state.memory["step"] == 1


def test_microbatch_scope_refuses_rules_the_loss_cannot_feed(setup, tmp_path):
    with pytest.raises(ValueError, match="scope='microbatch' selects from the training forward.*attn_entropy"):
        _trainer(setup, tmp_path, get_method("anchor", scope="microbatch"))
