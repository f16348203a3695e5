"""The vLLM engine of a run: TRL's GRPOConfig arguments from our keys, and the CPU workarounds.

TRL 1.16 builds the colocated engine itself (`trl.generation.vllm_generation.VLLMGeneration`,
`LLM(model=model.name_or_path, ...)`) and pushes the policy's weights into it before each
generation (`sync_weights`, through `model_runner.model.load_weights`). Three things it does not
do, which this module does, in one place (docs/vllm.md):

1. **dtype.** TRL passes none, and vLLM's `dtype="auto"` runs an fp32 checkpoint in bf16: before
   any update the engine's log-probs differ from the policy's by up to ~0.3. The engine gets the
   policy's dtype (`model.dtype`) unless `trainer.vllm_dtype` sets another.
2. **seed.** TRL seeds each engine with its process index (`process_index // tp`); the engine gets
   the run's seed plus that index, so a run's rollouts follow `seed` (docs/design.md, "Seeds").
3. **oneDNN repacking (CPU only).** vLLM's CPU backend repacks linear weights for oneDNN at load
   time and replaces `layer.weight`, so the first weight sync fails (`'Parameter' object has no
   attribute 'weight_loader'`). `vllm._custom_ops._supports_onednn = False` before the engine is
   built makes it use `F.linear` on the live weights.

(1) and (2) go through `engine_factory`, installed as the `LLM` TRL's module calls
(`trl_internals.install_engine_factory`). `engine_weights`
and `expected_engine_weights` read the engine's weights out of vLLM's model runner and put the
policy's into vLLM's fused layout, so a test checks a sync against the engine itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# Whether vLLM is installed is a question of the config's checks (a run with use_vllm, `eval --engine vllm`);
# the command line and the vLLM tests still import it from here (stare_lab.cli.training, tests).

# A first logged step whose mean |Δ log-prob| (engine's sampling log-prob vs the training forward's, over
# the valid completion tokens) exceeds this prints one warning line. Measured on the built-in model,
# before any update (docs/vllm.md, "Mismatch"): fp32 policy in an fp32 engine 3.9e-7 (max 1.2e-6);
# bf16 policy in a bf16 engine 2.7e-5 (max 3.0e-4); fp32 policy in a bf16 engine, the silent case,
# 5.8e-4 (max 1.2e-2). The mean, not the max: the max grows with the batch, the mean does not.
# 2e-4 is 7x the bf16/bf16 mean and a third of the fp32/bf16 one.
MISMATCH_WARN = 2e-4

_ENGINE: dict[str, Any] = {"dtype": None, "seed": 0, "reuse": None}


def grpo_vllm_args(trainer: Mapping[str, Any], model_dtype: str, seed: int) -> dict[str, Any]:
    """GRPOConfig's vLLM arguments from `trainer.*` (runner.build_grpo_config), with the engine prepared
    for them when vLLM is used: dtype (the policy's unless `vllm_dtype`), the run's seed, the CPU workaround."""
    t = trainer
    if not t["use_vllm"]:
        return {"use_vllm": False}
    args: dict[str, Any] = {
        "use_vllm": True,
        "vllm_mode": t["vllm_mode"],
        "vllm_importance_sampling_correction": t["vllm_importance_sampling_correction"],
        "vllm_importance_sampling_mode": t["vllm_importance_sampling_mode"],
    }
    if t["vllm_mode"] == "colocate":
        args["vllm_gpu_memory_utilization"] = t["vllm_gpu_memory_utilization"]
        args["vllm_tensor_parallel_size"] = t["vllm_tensor_parallel_size"]
        prepare(dtype=t.get("vllm_dtype") or model_dtype, seed=seed, cpu=bool(t["use_cpu"]))
    else:  # stare_lab.serving.vllm_server started the server and wrote its address into these keys
        if t.get("vllm_server_port") is None:
            raise ValueError(
                "trainer.vllm_server_port: unset; start the server first (stare_lab.serving.vllm_server.serving)"
            )
        args["vllm_server_host"] = t["vllm_server_host"]
        args["vllm_server_port"] = int(t["vllm_server_port"])
        args["vllm_server_timeout"] = float(t["vllm_server_timeout"])
    return args


def prepare(dtype: str, seed: int = 0, cpu: bool = True) -> None:
    """Make the next engine TRL builds in this process use `dtype` and `seed` (+ TRL's process offset);
    on CPU, switch oneDNN repacking off first. Idempotent."""
    from stare_lab.training import trl_internals  # deferred: trl; tracking imports this module for MISMATCH_WARN

    _ENGINE.update(dtype=dtype, seed=int(seed))
    if cpu:
        import vllm._custom_ops as ops  # deferred: vLLM is optional (its own environment, docs/vllm.md)

        ops._supports_onednn = False
    trl_internals.install_engine_factory(engine_factory)  # the `LLM` TRL's module calls (trl_internals, reach 11)


def engine_factory(*args, **kwargs):
    """`vllm.LLM` as TRL calls it, with the prepared dtype and the run's seed; with `reuse_engines()`
    active, one engine per (model, dtype) for the whole process (tests: TRL syncs the weights before
    every generation, so a reused engine samples from the current policy)."""
    import vllm  # deferred: optional, as in prepare

    if _ENGINE["dtype"] is not None:
        kwargs["dtype"] = _ENGINE["dtype"]
    kwargs["seed"] = _ENGINE["seed"] + int(kwargs.get("seed") or 0)
    cache = _ENGINE["reuse"]
    if cache is None:
        return vllm.LLM(*args, **kwargs)
    key = (kwargs.get("model"), kwargs.get("dtype"))
    if key not in cache:
        cache[key] = vllm.LLM(*args, **kwargs)
    return cache[key]


def reuse_engines(enabled: bool = True) -> None:
    """Keep every engine built from now on and hand it out again for the same model and dtype (tests and
    benchmarks: ~30 s per engine start on CPU). Never in a run: two trainers would share one engine."""
    _ENGINE["reuse"] = {} if enabled else None


def build_llm(model_path: str, dtype: str, seed: int = 0, cpu: bool = True, **kwargs):
    """A `vllm.LLM` outside TRL (evaluation), under the same dtype/seed/CPU rules."""
    prepare(dtype=dtype, seed=seed, cpu=cpu)
    kwargs.setdefault("gpu_memory_utilization", 0.3)
    return engine_factory(model=model_path, **kwargs)


# ----------------------------------------------------------------------- the engine's weights
def runner_model(llm):
    """The torch module vLLM samples with (TRL's `sync_weights` writes into the same one)."""
    return llm.llm_engine.model_executor.driver_worker.model_runner.model


def load_policy(llm, model) -> None:
    """Push `model`'s weights into the engine the way TRL's colocated sync does (an engine reused for
    another model of the same architecture, e.g. evaluating a checkpoint with the training engine)."""
    runner_model(llm).load_weights(list(policy_weights(model).items()))
    llm.reset_prefix_cache()


def engine_weights(llm) -> dict[str, Any]:
    """{name: tensor} of the engine's parameters, as vLLM holds them (fused qkv/gate_up, its dtype)."""
    return {name: p.detach().clone() for name, p in runner_model(llm).named_parameters()}


# vLLM's fused parameters and the policy's projections stacked into them (vLLM's `stacked_params_mapping`).
FUSED = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj")))


def policy_weights(model) -> dict[str, Any]:
    """{name: tensor} of the policy as TRL pushes it: a PEFT model's adapters merged, names without PEFT
    prefixes (TRL's `_iter_named_params`), tied weights once."""
    from accelerate.utils import is_peft_model  # deferred: accelerate imports torch

    if not is_peft_model(model):
        return {n: p.detach().clone() for n, p in model.named_parameters()}
    model.merge_adapter()
    try:
        out = {}
        for n, p in model.named_parameters():
            n = n.removeprefix("base_model.model.").replace(".base_layer", "")
            if model.prefix not in n and "original_module" not in n:
                out[n.replace("modules_to_save.default.", "")] = p.detach().clone()
        return out
    finally:
        model.unmerge_adapter()


def expected_engine_weights(policy: Mapping[str, Any], engine_names: Iterator[str] | list[str]) -> dict[str, Any]:
    """The policy's weights laid out as the engine's parameters `engine_names` (fused projections
    concatenated; a tied LM head is the embedding)."""
    import torch  # deferred: torch, as the command line imports this module

    out = {}
    for name in engine_names:
        parts = [name]
        for fused, pieces in FUSED:
            if f".{fused}." in name:
                parts = [name.replace(fused, piece) for piece in pieces]
        if name == "lm_head.weight" and name not in policy:
            parts = ["model.embed_tokens.weight"]
        out[name] = torch.cat([policy[p] for p in parts], dim=0)
    return out


def weight_mismatch(llm, model) -> dict[str, float]:
    """{engine parameter: max |engine - policy|} (policy cast to the engine's dtype), plus the LM head the
    engine samples with (`lm_head.weight`, also when vLLM ties it to the embedding and lists it once)."""
    engine = engine_weights(llm)
    module = runner_model(llm)
    head = getattr(module, "lm_head", None)
    if head is not None and getattr(head, "weight", None) is not None:
        engine["lm_head.weight"] = head.weight.detach().clone()
    expected = expected_engine_weights(policy_weights(model), list(engine))
    return {n: _max_diff(engine[n], expected[n]) for n in engine}


def _max_diff(engine, policy) -> float:
    """max |engine - policy| in the engine's dtype; vLLM pads the vocabulary rows of the embedding and LM
    head (to a multiple of 64), so only the policy's rows are compared (the padding is never sampled)."""
    if engine.shape[1:] == policy.shape[1:] and engine.shape[0] > policy.shape[0]:
        engine = engine[: policy.shape[0]]
    if engine.shape != policy.shape:
        return float("inf")
    return float((engine.float() - policy.to(engine.dtype).float()).abs().max())
