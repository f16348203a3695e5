"""Kept batches: the record round-trips exactly; the trainer hook keeps, on kept steps only, every
statistic any rule reads (aligned with a plain forward of the model), and on the loaded batch the
run's own rule gives exactly the weights the trainer trained with."""

from __future__ import annotations

import pytest
import torch
from fixtures_trainer import length_reward
from synthetic_batch import random_batch_tensors

from stare_lab.methods import get_method, list_methods
from stare_lab.record.kept_batch import BatchError
from stare_lab.stats import TokenStats
from stare_lab.tasks.arithmetic import ArithmeticTask
from stare_lab.training.kept_batches import needed_statistics, stats_for_all_rules
from stare_lab.viewer import collect_for_trainer, kept_steps, load_batch, save_batch
from stare_lab.viewer.selection import apply_all_rules, apply_rule

G = 4


def test_record_round_trips_exactly(tmp_path):
    kw = random_batch_tensors(B=8, T=12, G=G, seed=1)
    kw["advantages"] = torch.randn(8, 12)  # token-level advantages are kept as [B, T]
    kw["prompts"][0] = "naïve </script> ∑ \n"
    kw["stats"]["entropy"] = kw["stats"]["entropy"] + 1e-7  # float32 values that float16 would round
    path = save_batch(
        tmp_path / "batches" / "step-3.safetensors",
        3,
        **kw,
        run_rule={"name": "rsi_band", "params": {"low": 0.4}},
        rule_state={"step": 3, "total_steps": 9, "seed": 5, "memory": {"x": 1.5}},
        trained_weights=torch.rand(8, 12),
        meta={"num_layers": 2, "attn_layers": [1]},
    )
    b = load_batch(path)
    assert kept_steps(tmp_path) == [3] and b.step == 3
    assert torch.equal(b.completion_ids, kw["completion_ids"]) and torch.equal(b.mask, kw["mask"])
    assert torch.equal(b.advantages, kw["advantages"]) and torch.equal(b.rewards, kw["rewards"])
    assert torch.equal(b.group, kw["group"]) and b.prompts == kw["prompts"]
    for name, value in kw["stats"].items():
        assert b.stats[name].dtype == torch.float32 and torch.equal(b.stats[name], value.float()), name
    assert b.run_rule == {"name": "rsi_band", "params": {"low": 0.4}} and b.rule_state["memory"] == {"x": 1.5}
    assert b.token_pieces(0) == [kw["token_pieces"][i] for i in kw["completion_ids"][0][kw["mask"][0] > 0].tolist()]
    assert path.stat().st_size < 20_000


def test_loading_something_else_is_a_batch_error(tmp_path):
    with pytest.raises(BatchError, match="does not exist"):
        load_batch(tmp_path / "nope.safetensors")
    (tmp_path / "x.safetensors").write_text("{}")
    with pytest.raises(BatchError, match="not a readable batch record"):
        load_batch(tmp_path / "x.safetensors")


@pytest.fixture(scope="module")
def task():
    return ArithmeticTask(train_size=32, heldout_size=8)


def _plain_forward(model, batch):
    """log π of the sampled tokens and the entropy at each completion position, from model(...).logits."""
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
    att = torch.cat([batch.prompt_mask, batch.mask], 1).long()
    P, T = batch.prompt_ids.size(1), batch.completion_ids.size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits[:, P - 1 : P + T - 1].float()
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize(
    "rule",
    [("stare", {"H_tgt": 10.0, "W": 1.25}), ("anchor", {"layers": 0}), ("full", {})],
    ids=["stare", "anchor-layer0", "full"],
)
def test_trainer_hook_keeps_every_statistic_and_reproduces_training_weights(make_trainer, task, tmp_path, rule):
    name, params = rule
    trainer = make_trainer(get_method(name, **params), task.train_dataset())
    ds = trainer.train_dataset
    trainer.model.train()
    state_before = trainer.rule_state.to_dict()
    torch.manual_seed(1)
    out = trainer._generate_and_score_completions([ds[i] for i in range(2) for _ in range(G)])

    trainer.state.global_step = 3
    assert collect_for_trainer(trainer, out, None, run_dir=tmp_path, every=2, rule_state=state_before) is None
    assert collect_for_trainer(trainer, out, None, run_dir=tmp_path, every=0, rule_state=state_before) is None
    trainer.state.global_step = 0
    path = collect_for_trainer(
        trainer, out, None, run_dir=tmp_path, every=2, rule_state=state_before, trained_weights=out["token_weights"]
    )
    assert path == tmp_path / "batches" / "step-0.safetensors" and kept_steps(tmp_path) == [0]
    batch = load_batch(path)

    # every statistic any rule reads, and a second attention layer set for anchor(layers=0)
    needs, _ = needed_statistics(trainer.rule, trainer.trainer_values)
    assert needs - {"attn_entropy"} <= set(batch.stats) and "attn_entropy" in batch.stats
    assert batch.meta["attn_layers"] == [1] and ("attn_entropy@0" in batch.stats) == (name == "anchor")
    views = apply_all_rules(batch)
    assert [v.key for v in views] == [f"run:{name}", *list_methods()]
    assert all(v.computable for v in views), [(v.key, v.reason) for v in views if not v.computable]

    # the run's rule on the loaded batch = the weights the trainer trained with, exactly
    own = views[0]
    assert torch.equal(own.weights, out["token_weights"].float()) and torch.equal(batch.trained_weights, own.weights)
    if name == "stare":
        assert (own.weights == 1.25).any()

    # statistics aligned with a plain forward; rewards, pieces and prompts as the trainer saw them
    valid = batch.mask > 0
    logp, entropy = _plain_forward(trainer.model, batch)
    assert torch.allclose(batch.stats["logp"][valid], logp[valid], atol=1e-4)
    assert torch.allclose(batch.stats["entropy"][valid], entropy[valid], atol=1e-4)
    if name == "anchor":
        from stare_lab.signals import attention_entropy

        ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
        att = torch.cat([batch.prompt_mask, batch.mask], 1).long()
        P, T = batch.prompt_ids.size(1), batch.completion_ids.size(1)
        ae0 = attention_entropy(trainer.model, ids, att, layers=(0,))[:, P - 1 : P + T - 1]
        assert torch.allclose(batch.stats["attn_entropy@0"][valid], ae0[valid], atol=1e-5)
        assert not torch.allclose(batch.stats["attn_entropy@0"][valid], batch.stats["attn_entropy"][valid])
    tok = trainer.processing_class
    texts = [
        tok.decode(row[m > 0].tolist(), skip_special_tokens=True)
        for row, m in zip(batch.completion_ids, batch.mask, strict=True)
    ]
    assert batch.rewards.tolist() == length_reward(texts)
    for row in range(batch.shape[0]):
        ids = batch.completion_ids[row][valid[row]].tolist()
        assert "".join(batch.token_pieces(row)) == tok.decode(ids, skip_special_tokens=False)
    assert len(set(batch.prompts)) == 2 and all(p for p in batch.prompts)

    # statistics the trainer passes are stored as they are; only the missing ones are computed
    mine = TokenStats(
        logp=batch.stats["logp"],
        mask=batch.mask,
        advantages=batch.advantages,
        group=batch.group,
        entropy=batch.stats["entropy"] + 1.0,
    )
    got = stats_for_all_rules(
        trainer.model, out, mine, num_generations=G, run_rule=trainer.rule, trainer=trainer.trainer_values
    )
    assert torch.equal(got["entropy"], mine.entropy) and torch.allclose(got["js"], batch.stats["js"], atol=1e-6)


def test_applying_a_rule_the_batch_can_not_feed_names_what_is_missing(tmp_path):
    kw = random_batch_tensors(B=8, T=10, G=G)
    del kw["stats"]["attn_entropy"]
    path = save_batch(
        tmp_path / "b.safetensors",
        0,
        **kw,
        run_rule={"name": "full", "params": {}},
        meta={"num_layers": 4, "attn_layers": [2]},
    )
    batch = load_batch(path)
    assert apply_rule(batch, "anchor").reason == "not computable: needs attn_entropy at layers [2]"
    assert apply_rule(batch, "gmts").reason.startswith("not computable: rule 'gmts'")  # no trainer values kept
    assert apply_rule(batch, "nope").reason.startswith("not computable: unknown token rule 'nope'")


def test_hook_inside_training_keeps_the_due_steps_and_each_reproduces_its_weights(make_trainer, task, tmp_path):
    """The wiring the trainer gets, emulated around `_generate_and_score_completions`: state before the
    rule, the hook after it. `random` draws from (seed, step): reproducing it proves the kept state."""
    trainer = make_trainer(get_method("random", rho=0.3), task.train_dataset())
    trainer.args.max_steps = 5
    generate, trained = trainer._generate_and_score_completions, {}

    def with_hook(inputs):
        before = trainer.rule_state.to_dict()
        before["step"] = trainer.state.global_step  # the trainer sets the step just before the rule runs
        out = generate(inputs)
        trained[trainer.state.global_step] = out["token_weights"].clone()
        collect_for_trainer(
            trainer,
            out,
            None,
            run_dir=tmp_path / "run",
            every=2,
            rule_state=before,
            trained_weights=out["token_weights"],
        )
        return out

    trainer._generate_and_score_completions = with_hook
    trainer.train()
    assert sorted(trained) == [0, 1, 2, 3, 4] and kept_steps(tmp_path / "run") == [0, 2, 4]
    for step in (0, 2, 4):
        batch = load_batch(tmp_path / "run" / "batches" / f"step-{step}.safetensors")
        own = apply_rule(batch, "random", batch.run_rule["params"], own=True)
        assert batch.step == step and torch.equal(own.weights, trained[step].float())
    assert not torch.equal(trained[0], trained[2])


def test_the_page_shows_which_tokens_a_loss_changing_rule_touches_and_how(tmp_path):
    """Archer: its two entropy sets of each response (wide clip / tight clip + KL); KL-Cov: its top-Cov
    tokens; DPPO on-policy (old = rollout): nothing outside the trust region."""
    import dataclasses

    from stare_lab.methods import TrainerValues, archer, kl_cov

    kw = random_batch_tensors(B=8, T=10, G=G)
    values = TrainerValues(epsilon_low=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo", num_generations=G)
    meta = {"num_layers": 4, "attn_layers": [2], "trainer": dataclasses.asdict(values)}
    batch = load_batch(
        save_batch(tmp_path / "b.safetensors", 0, **kw, run_rule={"name": "full", "params": {}}, meta=meta)
    )
    valid = batch.mask > 0
    view = apply_rule(batch, "archer")
    widened, penalised = archer.entropy_sets(batch.stats["entropy"], batch.mask, archer.Params(kl_coef=0.0))
    assert torch.equal(view.touched["wide clip, no KL (high entropy)"], widened)
    assert torch.equal(view.touched["tight clip + KL (low entropy)"], penalised)
    assert torch.equal(view.selected, valid) and 0 < widened.sum() < valid.sum()
    n = float(valid.sum())
    assert view.metrics["touched: wide clip, no KL (high entropy)"] == pytest.approx(float(widened.sum()) / n)
    view = apply_rule(batch, "kl_cov")
    want = kl_cov.selected_tokens(batch.stats["logp"], batch.advantages, batch.mask, kl_cov.Params().ratio)
    assert torch.equal(view.selected, want) and int(view.selected.sum()) == max(1, int(n * 2e-3))
    view = apply_rule(batch, "dppo")
    assert view.reason is None and not view.selected.any()
