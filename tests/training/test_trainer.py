"""The trainer core against plain TRL: `full` reproduces GRPOTrainer's loss and gradients to the bit,
weights are 0 on padding and finite, and the loss does not depend on the micro-batch split."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from fixtures_trainer import grpo_config, length_reward, trainer_kwargs
from transformers import TrainerCallback
from trl import GRPOTrainer

from stare_lab.methods import get_method
from stare_lab.training.trainer import TokenRuleGRPOTrainer

G = 4


def _args(tmp_path, **kw):
    return grpo_config(tmp_path, **{"gradient_accumulation_steps": 2, **kw})


def _pair(tiny_arithmetic, tmp_path, rule="full", **kw):
    tok, model, task = tiny_arithmetic
    args = _args(tmp_path, **kw)
    ds = task.train_dataset()

    def fresh() -> dict:  # each trainer its own copy of the model
        return trainer_kwargs(tok, model if isinstance(model, str) else copy.deepcopy(model), args, ds)

    plain = GRPOTrainer(**fresh())
    ours = TokenRuleGRPOTrainer(**fresh(), rule=get_method(rule))
    return plain, ours, ds


def _generation_batch(trainer, ds, n_prompts):
    rows = [ds[i] for i in range(n_prompts)]
    trainer.model.train()
    torch.manual_seed(1)
    return trainer._generate_and_score_completions([r for r in rows for _ in range(G)])


def _loss_and_grads(trainer, inputs):
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters()]


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_full_equals_plain_trl_bitwise(tiny_arithmetic, tmp_path, loss_type):
    plain, ours, ds = _pair(tiny_arithmetic, tmp_path, loss_type=loss_type)
    batch = _generation_batch(ours, ds, n_prompts=2)
    assert torch.equal(batch["token_weights"], batch["completion_mask"].float())
    l_plain, g_plain = _loss_and_grads(plain, batch)
    l_ours, g_ours = _loss_and_grads(ours, batch)
    assert l_plain.item() != 0.0 or all(g.abs().sum() == 0 for g in g_plain)
    assert torch.equal(l_plain, l_ours), (l_plain.item(), l_ours.item())
    assert all(torch.equal(a, b) for a, b in zip(g_plain, g_ours, strict=True))
    assert any(g.abs().sum() > 0 for g in g_ours), "a batch with mixed rewards must give a gradient"


def test_full_equals_plain_trl_with_kl(tiny_arithmetic, tmp_path):
    tok, model, task = tiny_arithmetic
    saved = tmp_path / "model"  # with β > 0 TRL loads the reference model by path
    model.save_pretrained(saved)
    tok.save_pretrained(saved)
    plain, ours, ds = _pair((tok, str(saved), task), tmp_path, beta=0.04)
    batch = _generation_batch(ours, ds, n_prompts=2)
    assert "ref_per_token_logps" in batch
    l_plain, g_plain = _loss_and_grads(plain, batch)
    l_ours, g_ours = _loss_and_grads(ours, batch)
    assert torch.equal(l_plain, l_ours)
    assert all(torch.equal(a, b) for a, b in zip(g_plain, g_ours, strict=True))


def test_stare_gate_closed_equals_full_loss(tiny_arithmetic, tmp_path):
    tok, model, task = tiny_arithmetic
    _, full_t, ds = _pair(tiny_arithmetic, tmp_path)
    stare_t = TokenRuleGRPOTrainer(  # H̄ ≥ 0 = H_tgt: the gate is closed
        **trainer_kwargs(tok, copy.deepcopy(full_t.model), full_t.args, ds), rule=get_method("stare", H_tgt=0.0)
    )
    batch = _generation_batch(stare_t, ds, n_prompts=2)
    assert torch.equal(batch["token_weights"], batch["completion_mask"].float())
    # closed gate: every valid token is trained, so every one counts as selected in the metrics
    assert torch.equal(batch["token_selected"], batch["completion_mask"].float())
    assert stare_t._metrics["train"]["tokens/selected_frac"][-1] == 1.0
    l_full, g_full = _loss_and_grads(full_t, batch)
    l_stare, g_stare = _loss_and_grads(stare_t, batch)
    assert torch.equal(l_full, l_stare)
    assert all(torch.equal(a, b) for a, b in zip(g_full, g_stare, strict=True))


@pytest.mark.parametrize("rule", ["top_entropy", "anchor", "ict", "rsi_band", "opefo"])
def test_weights_zero_on_padding_and_split_invariant(tiny_arithmetic, tmp_path, rule):
    """The loss summed over micro-batches is the same for a 1-way and a 2-way split of one generation batch."""
    _, ours, ds = _pair(tiny_arithmetic, tmp_path, rule=rule)
    if rule == "ict":
        ours.rule = get_method("ict", warmup_steps=0)
    if rule == "rsi_band":  # an untrained model has RSI ≈ 1 everywhere: split the batch at the neutral point
        ours.rule = get_method("rsi_band", low=1.0, high=10.0)
    batch = _generation_batch(ours, ds, n_prompts=4)
    w, mask = batch["token_weights"], batch["completion_mask"]
    assert torch.isfinite(w).all() and (w[mask == 0] == 0).all()
    assert (w[mask > 0] != 1).any(), "a selective rule must not weight every token 1"

    def total(splits):
        ours.args.steps_per_generation = splits
        ours.args.gradient_accumulation_steps = splits
        B = batch["completion_ids"].size(0)
        loss = 0.0
        for i in range(splits):
            sl = slice(i * B // splits, (i + 1) * B // splits)
            part = {k: (v[sl] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in batch.items()}
            ours.current_gradient_accumulation_steps = splits
            loss = loss + ours._compute_loss(ours.model, part).item()
        return loss

    one, two = total(1), total(2)
    assert one == pytest.approx(two, rel=1e-5, abs=1e-7)


def test_group_advantages_match_loop_reference(tiny_arithmetic, tmp_path):
    """A_i = (R_i − mean_j R_j) / (std_j R_j + 1e-4) within each group of G rows (std with Bessel's correction)."""
    tok, _, _ = tiny_arithmetic
    _, ours, ds = _pair(tiny_arithmetic, tmp_path)
    batch = _generation_batch(ours, ds, n_prompts=3)
    texts = tok.batch_decode(batch["completion_ids"] * batch["completion_mask"], skip_special_tokens=True)
    rewards = length_reward(texts)
    expected = []
    for g in range(0, len(rewards), G):
        r = rewards[g : g + G]
        mean = sum(r) / G
        std = (sum((x - mean) ** 2 for x in r) / (G - 1)) ** 0.5
        expected += [(x - mean) / (std + 1e-4) for x in r]
    assert batch["advantages"].tolist() == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert any(abs(a) > 0.1 for a in expected)


class _CrashOnSave(TrainerCallback):
    """A crash right after transformers has written a checkpoint (its callbacks' on_save)."""

    def on_save(self, args, state, control, **kwargs):
        raise RuntimeError("simulated crash while saving")


def test_rule_state_is_in_the_checkpoint_before_it_counts_as_complete(tiny_arithmetic, tmp_path):
    """A checkpoint is complete once trainer_state.json exists; rule_state.json must already be there."""
    tok, model, task = tiny_arithmetic
    args = _args(tmp_path, max_steps=1, save_strategy="steps", save_steps=1, gradient_accumulation_steps=1)

    def adaptive_stare(**kw):
        kwargs = trainer_kwargs(tok, copy.deepcopy(model), args, task.train_dataset())
        return TokenRuleGRPOTrainer(**kwargs, rule=get_method("stare", adaptive=True, H_tgt=5.0), **kw)

    trainer = adaptive_stare(callbacks=[_CrashOnSave()])
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.train()
    ckpt = tmp_path / "checkpoint-1"
    assert (ckpt / "trainer_state.json").is_file()
    saved = json.loads((ckpt / "rule_state.json").read_text())
    assert saved["memory"]["W"] == pytest.approx(1.11) and saved["step"] == 0  # one adaptive step from W = 1.1
    fresh = adaptive_stare()
    fresh.load_rule_state(ckpt)
    assert fresh.rule_state.memory == saved["memory"] and fresh.rule_state.trainer == fresh.trainer_values
    (ckpt / "rule_state.json").unlink()
    with pytest.raises(FileNotFoundError) as e:
        fresh.load_rule_state(ckpt)
    assert str(ckpt) in str(e.value) and "rule_state.json" in str(e.value) and "\n" not in str(e.value)


def test_kept_batches_from_the_trainer_reproduce_the_trained_weights(tiny_arithmetic, tmp_path):
    """keep_batches_every=2: steps 0 and 2 are kept by the trainer itself; each record's run rule (random,
    drawn from seed and step) gives the weights the step trained with."""
    from stare_lab.viewer import kept_steps, load_batch
    from stare_lab.viewer.selection import apply_rule

    tok, model, task = tiny_arithmetic
    args = _args(tmp_path, max_steps=3, gradient_accumulation_steps=1)
    trainer = TokenRuleGRPOTrainer(
        **trainer_kwargs(tok, copy.deepcopy(model), args, task.train_dataset()),
        rule=get_method("random", rho=0.3),
        keep_batches_every=2,
        run_dir=tmp_path / "run",
    )
    generate, trained = trainer._generate_and_score_completions, {}

    def spy(inputs):
        out = generate(inputs)
        trained[trainer.state.global_step] = out["token_weights"].clone()
        return out

    trainer._generate_and_score_completions = spy
    trainer.train()
    assert sorted(trained) == [0, 1, 2] and kept_steps(tmp_path / "run") == [0, 2]
    for step in (0, 2):
        batch = load_batch(tmp_path / "run" / "batches" / f"step-{step}.safetensors")
        assert torch.equal(batch.trained_weights, trained[step].float())
        own = apply_rule(batch, "random", batch.run_rule["params"], own=True)
        assert torch.equal(own.weights, trained[step].float())
    assert not torch.equal(trained[0], trained[2])
    with pytest.raises(ValueError, match="needs run_dir"):
        TokenRuleGRPOTrainer(
            model=copy.deepcopy(model),
            reward_funcs=[length_reward],
            args=_args(tmp_path),
            train_dataset=task.train_dataset(),
            processing_class=tok,
            rule=get_method("full"),
            keep_batches_every=1,
        )
