"""Statistics for free (issue 11): every source of a rule's statistics gives the weights the separate pass gives.

Sources (signals/sources.py): "pass" (one no-grad forward after generation), "generation" (recorded
while transformers samples), "old_logp_forward" (TRL's own old-log-prob forward, num_iterations = 2).
On the same rollouts (same seed, same model) every rule's weights agree:
- old_logp_forward vs pass: bit-identical (the same token_statistics call on the same tensors);
- generation vs pass: statistics within 1e-4 (float32 CPU: the cached step-by-step forward adds in
  another order than the full forward, measured ≤ 2e-5), weights equal; the shipped trained model is
  used so that entropies have no near-ties that float noise could flip.
Forward counts: with num_iterations = 2 every rollout row goes through exactly one no-grad forward
of the rollout policy per generation batch (TRL's own; plain TRL does the same); on-policy with
transformers generation, entropy and attention rules and ICT (JS, one process) make none.
"""

from __future__ import annotations

import copy
import zlib

import pytest
import torch
from fixtures_trainer import builtin_lm, grpo_config, rule_trainer

from stare_lab.methods import RuleState, get_method, list_methods
from stare_lab.signals import token_statistics
from stare_lab.signals.generation import record_generation
from stare_lab.tasks.arithmetic import ArithmeticTask
from stare_lab.training.trainer import TokenRuleGRPOTrainer

G = 4
GEN_ATOL = 1e-4


def length_reward(completions, **kwargs):
    """Varies within groups even when every completion runs to the length limit."""
    return [float(zlib.crc32(c.encode()) % 7) for c in completions]


def _args(tmp_path, **kw):
    return grpo_config(
        tmp_path, **{"gradient_accumulation_steps": 2, "max_completion_length": 16, "temperature": 0.8, **kw}
    )


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    return (*builtin_lm(), ArithmeticTask(train_size=64, heldout_size=8))


def _trainer(setup, tmp_path, rule="full", **kw):
    tok, model, task = setup
    extra = {k: kw.pop(k) for k in ("stats_at_generation",) if k in kw}
    args = _args(tmp_path, **kw)
    return rule_trainer(tok, copy.deepcopy(model), args, task.train_dataset(), rule, length_reward, **extra)


def _rows(trainer, n_prompts=4):
    ds = trainer.train_dataset
    return [ds[i] for i in range(n_prompts) for _ in range(G)]


def _generate(trainer, rule, path_setup):
    """The generation batch of `rule` with the trainer set up for one path; the same rollouts every time."""
    trainer.rule = rule
    trainer.rule_state = RuleState(seed=0)
    trainer.rule_state.trainer = trainer.trainer_values
    path_setup(trainer)
    trainer.model.train()
    token_stats, seen = TokenRuleGRPOTrainer._token_stats.__get__(trainer), {}

    def spy(out, given=None):
        seen["given"] = sorted(given or {})
        return token_stats(out, given)

    trainer._token_stats = spy
    torch.manual_seed(1)
    out = trainer._generate_and_score_completions(_rows(trainer))
    path = trainer.stats_source()
    if path in ("generation", "old_logp_forward"):  # the statistics really came from that source
        assert "logp" in seen["given"] and trainer.model_needs() <= set(seen["given"]), seen
    return out, path


def _pass(t):
    t.stats_at_generation, t.num_iterations = False, 1


def _generation(t):
    t.stats_at_generation, t.num_iterations = True, 1


def _old_logp_forward(t):
    t.stats_at_generation, t.num_iterations = True, 2


@pytest.mark.parametrize("name", list_methods())
def test_every_path_gives_the_weights_of_the_pass(setup, tmp_path, name):
    trainer = _trainer(setup, tmp_path)
    rule = get_method(name, **({"H_tgt": 10.0} if name == "stare" else {}))  # STARE with its gate open
    ref, path = _generate(trainer, rule, _pass)
    assert path in ("pass", "none")
    for setup_path, expected in (
        (_generation, {"generation", "pass", "none"}),
        (_old_logp_forward, {"old_logp_forward", "none"}),
    ):
        out, path = _generate(trainer, rule, setup_path)
        assert path in expected, (name, path)
        assert torch.equal(out["completion_ids"], ref["completion_ids"]), "the same rollouts"
        if path == "old_logp_forward":
            assert torch.equal(out["token_weights"], ref["token_weights"]), name
        else:
            assert torch.allclose(out["token_weights"], ref["token_weights"], atol=GEN_ATOL), name
        assert torch.equal(out["token_normalize"], ref["token_normalize"])
        assert torch.allclose(out["token_weight_total"], ref["token_weight_total"], atol=GEN_ATOL * 100)


@pytest.mark.parametrize("flush_steps", [64, 16, 5, 1])
def test_generation_statistics_equal_the_pass(setup, flush_steps):
    """Every statistic generation records, against the pass on the same rollouts (left-padded prompts,
    rows ending at different lengths), at the sampling temperature; steps reduced all at the end (16 > 12
    new tokens), in batches of 5 with a partial last batch, and one at a time."""
    tok, model, _ = setup
    model = copy.deepcopy(model).eval()
    prompts = ["12+34=", "7*8=", "100-1=", "5+5="]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(2)]
    P = max(map(len, ids))
    prompt_ids = torch.tensor([[tok.pad_token_id] * (P - len(x)) + x for x in ids])
    prompt_mask = torch.tensor([[0] * (P - len(x)) + [1] * len(x) for x in ids])
    needs = {"logp", "entropy", "p2", "p2logp", "attn_entropy", "js"}
    torch.manual_seed(0)
    with record_generation(
        model, needs, temperature=0.7, attn_layers=(1, 3), js_group=2, eos_ids=(tok.eos_token_id,)
    ) as rec:
        rec.flush_steps = flush_steps
        seq = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=0.7,
            max_new_tokens=12,
            top_k=0,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    comp = seq[:, P:]
    eos = comp == tok.eos_token_id
    end = torch.where(eos.any(1), eos.int().argmax(1), torch.full((comp.size(0),), comp.size(1)))
    mask = (torch.arange(comp.size(1))[None] <= end[:, None]).long()
    assert 0 < int(mask.sum(1).min()) < comp.size(1), "rows must end at different lengths"
    got = rec.result(comp, mask)
    batch = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=comp, completion_mask=mask)
    ref = token_statistics(model, batch, needs, num_generations=2, temperature=0.7, attn_layers=(1, 3))
    assert set(got) == needs
    for k in needs:
        assert got[k].shape == ref[k].shape
        diff = ((got[k] - ref[k]) * mask).abs().max().item()
        assert diff <= GEN_ATOL, (k, diff)
        assert (ref[k] * mask).abs().max() > 0.01, k  # a statistic that is not trivially 0
    # a recording that does not line up with the completions is refused
    assert rec.result(comp.flip(0), mask.flip(0)) is None or torch.equal(comp, comp.flip(0))
    # a final mask that is not the live mask (TRL's mask_truncated_completions zeroes a whole row): no JS, the
    # pass computes it; the other statistics stay
    truncated = mask.clone()
    truncated[int(mask.sum(1).argmax())] = 0
    assert set(rec.result(comp, truncated)) == needs - {"js"}


def test_generation_js_needs_whole_groups_and_end_tokens(setup):
    """JS is recorded only with groups of G rows in the generate call and the end-of-sequence ids."""
    tok, model, _ = setup
    ids = torch.tensor([tok("12+34=", add_special_tokens=False)["input_ids"]] * 6)
    kw = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        max_new_tokens=4,
        pad_token_id=tok.pad_token_id,
    )
    for js_group, eos_ids, recorded in (
        (3, (tok.eos_token_id,), True),
        (4, (tok.eos_token_id,), False),
        (3, (), False),
        (None, (tok.eos_token_id,), False),
    ):
        with torch.no_grad(), record_generation(model, {"js", "entropy"}, js_group=js_group, eos_ids=eos_ids) as rec:
            seq = model.generate(**kw)
        comp = seq[:, ids.size(1) :]
        got = rec.result(comp, torch.ones_like(comp))
        assert got is not None and ("js" in got) == recorded, (js_group, eos_ids)


def _count_rollout_forwards(trainer):
    """{rows: rows through no-grad forwards of the policy outside generation, batches: generation batches}."""
    count = {"rows": 0, "batches": 0, "in_generation": False}
    decoder = trainer.accelerator.unwrap_model(trainer.model).model

    def pre(module, args, kwargs):
        if not torch.is_grad_enabled() and not count["in_generation"]:
            ids = kwargs.get("input_ids", args[0] if args else None)
            count["rows"] += ids.size(0)

    decoder.register_forward_pre_hook(pre, with_kwargs=True)
    generate_single, generate_batch = trainer._generate_single_turn, trainer._generate_and_score_completions

    def flagged(*a, **k):
        count["in_generation"] = True
        try:
            return generate_single(*a, **k)
        finally:
            count["in_generation"] = False

    def counted(*a, **k):
        count["batches"] += 1
        return generate_batch(*a, **k)

    trainer._generate_single_turn, trainer._generate_and_score_completions = flagged, counted
    return count


@pytest.mark.parametrize("rule", ["top_entropy", "anchor", "ict"])
def test_num_iterations_2_makes_one_no_grad_forward_per_generation_batch(setup, tmp_path, rule):
    trainer = _trainer(setup, tmp_path, rule, num_iterations=2, max_steps=2)
    assert trainer.stats_source() == "old_logp_forward"
    count = _count_rollout_forwards(trainer)
    trainer.train()
    rows = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    assert count["batches"] >= 1 and count["rows"] == rows * count["batches"], count


@pytest.mark.parametrize("rule", ["top_entropy", "stare", "anchor", "opefo", "ict"])
def test_on_policy_transformers_generation_makes_no_forward(setup, tmp_path, rule):
    trainer = _trainer(setup, tmp_path, rule, gradient_accumulation_steps=2, max_steps=2)
    assert trainer.stats_source() == "generation"
    count = _count_rollout_forwards(trainer)
    trainer.train()
    assert count["batches"] >= 1 and count["rows"] == 0, count
    off = _trainer(setup, tmp_path, rule, stats_at_generation=False, max_steps=1)
    count = _count_rollout_forwards(off)
    off.train()
    assert count["rows"] > 0, "the separate pass is a no-grad forward: the counter must see it"
