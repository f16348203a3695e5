"""The real model with vLLM colocated (issue 46, item 4): SmolLM2-135M-Instruct (`model=smollm2`) trains two
steps of `full` on its quick start's task (`task=chain_sum`) with vLLM's CPU engine generating the rollouts:
after every weight sync the engine's weights equal the policy's (its 30 layers, grouped-query attention and
tied head, fp32 into fp32: bit-equal), the engine's log-probabilities agree with the policy's (TRL's
sampling/ metrics), and the trained model evaluated through the engine (`eval=chain_sum`, Reasoning Gym's
own scoring) scores what transformers' sampler scores on the same held-out problems within a paired test's
tolerance."""

from __future__ import annotations

import numpy as np
import pytest
from engine_fixtures import SMALL, paired_z, watch_syncs

from stare_lab.config.run_config import compose
from stare_lab.evaluation import per_problem_counts
from stare_lab.evaluation.run_eval import evaluate_model
from stare_lab.record import read_eval_results
from stare_lab.run.runner import build_trainer
from stare_lab.training import vllm_engine

pytestmark = pytest.mark.vllm

N = 4  # samples per held-out problem (64 problems)
# The KV cache given explicitly (as tests/vllm_tests/test_smollm2_engine.py does): vLLM's CPU worker otherwise
# sizes it from the node's memory minus this process's RSS, which the suite's earlier engines can exhaust;
# and a 512-token model length, which that cache holds (TRL leaves it at the model's 8,192).
KV_BYTES = 256 << 20


def test_smollm2_trains_with_colocated_vllm_and_evaluates_through_it(tmp_path, monkeypatch, smollm2_folder):
    import pandas as pd

    build = vllm_engine.engine_factory

    def sized(*args, **kwargs):  # prompts and completions here fit 512 tokens (the model's own limit is 8192)
        return build(*args, **{**kwargs, "max_model_len": 512, "kv_cache_memory_bytes": KV_BYTES})

    monkeypatch.setattr(vllm_engine, "engine_factory", sized)
    cfg = compose(
        ["model=smollm2", "task=chain_sum", "eval=chain_sum", "method=full", "trainer.max_steps=2", *SMALL,
         "trainer.learning_rate=2e-5", f"eval.n={N}", "eval.enabled=true"]
    )  # fmt: skip
    trainer = build_trainer(cfg, tmp_path / "run")
    llm = trainer.vllm_generation.llm
    assert trainer.model.config.tie_word_embeddings and trainer.model.config.num_key_value_heads == 3
    assert llm.llm_engine.model_config.dtype.itemsize == 4  # the policy's fp32, not vLLM's bf16 "auto"
    seen = watch_syncs(trainer)
    trainer.train()
    assert len(seen) == 2 and all(after == 0.0 for _, after in seen), seen
    assert seen[1][0] > 0.0, seen  # the first step moved the policy away from the engine's copy
    assert trainer.state.global_step == 2
    logged = [r for r in trainer.state.log_history if "sampling/sampling_logp_difference/max" in r]
    assert len(logged) == 2, trainer.state.log_history
    for r in logged:  # fp32 in both, a 49,152-token softmax: the engine's log-probs within 1e-3 of the policy's
        assert (
            0.0 <= r["sampling/sampling_logp_difference/mean"] <= r["sampling/sampling_logp_difference/max"] < 1e-3
        ), r

    by = {}
    for name, sampler, tok in (("vllm", llm, None), ("transformers", trainer.model, trainer.processing_class)):
        out = tmp_path / name
        result = evaluate_model(sampler, tok, cfg, out, step=2)["rg:chain_sum"]
        assert result["engine"] == name and result["n"] == N
        (row,) = [r for r in read_eval_results(out) if r["benchmark"] == "rg:chain_sum"]
        assert row["engine"] == name
        df = pd.read_parquet(out / "eval" / "rg:chain_sum" / f"{result['settings_key']}.parquet")
        by[name] = per_problem_counts(df)
    acc = {k: v["c"] / v["n"] for k, v in by.items()}
    assert len(acc["vllm"]) == 64 and set(acc["vllm"].index) == set(acc["transformers"].index)
    z = paired_z(acc["vllm"], acc["transformers"].loc[acc["vllm"].index])
    print(f"\nsmollm2 avg@{N} on chain_sum: vllm {acc['vllm'].mean():.4f}, transformers "
          f"{acc['transformers'].mean():.4f}; paired z = {z:.2f}")  # fmt: skip
    assert 0.0 < float(np.mean(acc["vllm"])) < 1.0  # the untrained model scores ~10%: a test that can tell
    assert abs(z) < 3.29, (z, acc["vllm"].mean(), acc["transformers"].mean())  # two-sided p = 0.001
