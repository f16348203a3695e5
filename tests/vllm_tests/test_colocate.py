"""Colocated vLLM on CPU with our trainer: after every weight sync the engine's weights (read out of
vLLM's model runner) equal the policy's, tied LM head and LoRA-merged weights included; the engine
runs in the policy's dtype; one rule of each kind trains two steps and writes the engine/policy
mismatch into metrics.jsonl under its vllm/ names."""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import SMALL
from engine_fixtures import watch_syncs as _watch_syncs

from stare_lab.config.run_config import compose, save_config
from stare_lab.record import read_metrics
from stare_lab.run.runner import build_trainer, execute
from stare_lab.training import vllm_engine

pytestmark = pytest.mark.vllm


def test_engine_follows_every_sync_with_tied_head(tmp_path):
    trainer = build_trainer(compose(["method=top_entropy", "trainer.max_steps=2", *SMALL]), tmp_path)
    llm = trainer.vllm_generation.llm
    assert trainer.model.config.tie_word_embeddings  # the built-in model ties its LM head
    assert llm.llm_engine.model_config.dtype == torch.float32  # the policy's dtype, not vLLM's bf16 "auto"
    names = set(vllm_engine.weight_mismatch(llm, trainer.model))
    layer = "model.layers.0"
    assert {"lm_head.weight", f"{layer}.self_attn.qkv_proj.weight", f"{layer}.mlp.gate_up_proj.weight"} <= names
    seen = _watch_syncs(trainer)
    trainer.train()
    assert len(seen) == 2, seen  # one sync before each step's generation
    assert all(after == 0.0 for _, after in seen), seen  # fp32 into fp32: bit-equal, head included
    assert seen[1][0] > 0.0, seen  # the step changed the policy: before the second sync the engine was stale


def test_lora_merged_weights_reach_the_engine(tmp_path):
    lora = "+model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, v_proj]}"
    trainer = build_trainer(compose(["method=full", "trainer.max_steps=1", lora, *SMALL]), tmp_path)
    torch.manual_seed(0)
    with torch.no_grad():  # PEFT starts B at 0 (a no-op adapter): make the merge change q and v
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    base = vllm_engine.engine_weights(trainer.vllm_generation.llm)["model.layers.0.self_attn.qkv_proj.weight"]
    merged = vllm_engine.policy_weights(trainer.model)["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.allclose(base[: merged.shape[0]], merged)  # the check below can fail
    seen = _watch_syncs(trainer)
    trainer.train()
    assert len(seen) == 1 and seen[0][0] > 0 and seen[0][1] < 1e-6, seen
    assert not any("lora" in n for n in vllm_engine.engine_weights(trainer.vllm_generation.llm))


def test_engine_dtype_and_seed_follow_our_keys(monkeypatch):
    """The engine gets trainer.vllm_dtype when set, else the policy's; the run's seed is added to TRL's."""
    import vllm

    made = []
    monkeypatch.setattr(vllm, "LLM", lambda *a, **kw: made.append(kw))
    monkeypatch.setattr(vllm_engine, "_ENGINE", {"dtype": None, "seed": 0, "reuse": None})
    t = compose(["trainer.use_vllm=true"]).trainer
    vllm_engine.grpo_vllm_args(t, "float32", seed=7)
    vllm_engine.engine_factory(model="m", seed=1)
    t.vllm_dtype = "bfloat16"
    vllm_engine.grpo_vllm_args(t, "float32", seed=7)
    vllm_engine.engine_factory(model="m", seed=0)
    assert [(m["dtype"], m["seed"]) for m in made] == [("float32", 8), ("bfloat16", 7)]


def test_one_rule_of_each_kind_trains_two_steps_with_vllm(tmp_path):
    """A vocabulary rule, an attention rule, ict and a loss-changing rule of the field (dppo: its loss replaces
    TRL's surrogate and reads the old log-probs of TRL's IS forward), through `execute` (the run record
    included), on the session's one engine."""
    rules = (("top_entropy", []), ("anchor", []), ("ict", ["method.params.warmup_steps=1"]), ("dppo", []))
    for rule, extra in rules:
        d = tmp_path / rule
        save_config(compose([f"method={rule}", "trainer.max_steps=2", *SMALL, *extra]), d / "config.yaml")
        execute(d)
        rows = read_metrics(d)
        assert [r["step"] for r in rows] == [1, 2], rule
        for r in rows:
            assert 0.0 <= r["vllm/logp_diff_mean"] <= r["vllm/logp_diff_max"] < 1e-4, (rule, r)  # fp32 in fp32
            assert r["vllm/logp_diff_max"] == r["sampling/sampling_logp_difference/max"]
            assert r["vllm/is_ratio_min"] <= r["vllm/is_ratio_mean"] <= r["vllm/is_ratio_max"]
            assert 0.0 < r["tokens/selected_frac"] <= 1.0
            if rule == "dppo":  # its loss term ran: a fraction of the valid tokens left the trust region
                assert 0.0 <= r["rule/dropped_frac"] <= 1.0 and 0.0 <= r["rule/capped_frac"] <= 1.0, r
        assert (d / "final" / "model.safetensors").is_file()
