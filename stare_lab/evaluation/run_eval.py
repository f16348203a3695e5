"""Evaluation of a run: its final model on each configured benchmark (and, optionally, on
intermediate checkpoints during training, for curves).

Each benchmark is evaluated under its own settings (stare_lab/conf/benchmark/<name>.yaml: n,
temperature, top_p, max_tokens, verifier) unless the run's `eval.*` (the sweep) or the command
(`stare-lab eval --n 64`) sets them; a value left null falls through to the next source. A multi-process
run shards the sampling over its ranks and rank 0 writes (stare_lab.evaluation). Results
land in <run_dir>/eval/<benchmark>/<settings key>.{json,parquet} (stare_lab.record), so results
under different settings or steps live side by side; a result already there under the same
settings is not redone unless forced, and forcing replaces only that one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from transformers import TrainerCallback

from stare_lab.config.run_config import BENCHMARK_DATA_DIR
from stare_lab.core.controls import trains
from stare_lab.evaluation import (
    benchmark_config,
    engine_name,
    evaluate_benchmark,
    list_benchmarks,
    load_benchmark,
    resolve_verifier,
)
from stare_lab.models import load_model_and_tokenizer, resolve_model_path
from stare_lab.record import (
    EVAL_SETTINGS,
    FINAL_DIR,
    checkpoint_step,
    find_eval_result,
    last_checkpoint,
    process_count,
)
from stare_lab.tasks import build_task
from stare_lab.tasks.reasoning_gym import benchmark_task, chat_template_present
from stare_lab.training.vllm_engine import build_llm

# Where neither the command, the run's eval config nor the benchmark sets a value: the usual
# RLVR evaluation protocol (n = 32 samples, T = 1.0, top-p = 0.7); max_tokens defaults to the
# trainer's completion length.
FALLBACK = {"n": 32, "temperature": 1.0, "top_p": 0.7}


def local_benchmark_file(name: str) -> Path | None:
    """A local copy of a benchmark (no hub access needed): $STARE_LAB_BENCHMARKS/<name>.jsonl, else
    the copy shipped in the package (stare_lab.config.run_config.BENCHMARK_DATA_DIR)."""
    for root in (os.environ.get("STARE_LAB_BENCHMARKS"), BENCHMARK_DATA_DIR):
        if root and (Path(root) / f"{name}.jsonl").is_file():
            return Path(root) / f"{name}.jsonl"
    return None


def _benchmark(name: str, task, chat_template: bool = False) -> tuple[list[dict], Any, dict[str, Any]]:
    """(records, verifier, the benchmark's own settings) of one benchmark; the run's own task
    supplies its held-out split and its verifier; `rg:<dataset>` is a Reasoning Gym dataset's held-out
    problems (stare_lab.tasks.reasoning_gym.benchmark_task), prompted through the chat template when the
    model has one (`chat_template`)."""
    if name.startswith("rg:"):
        own = benchmark_config("reasoning_gym")
        rg_task = benchmark_task(name, task, own)
        rg_task.bind_chat(chat_template)
        return rg_task.benchmark_records(name[len("rg:") :]), rg_task, own
    if name == task.name and hasattr(task, "heldout_dataset"):
        records = [
            {
                "prompt": r["prompt"],
                "problem": r["prompt"],
                "answer": str(r["answer"]),
                "problem_id": str(r["problem_id"]),
            }
            for r in task.heldout_dataset()
        ]
        own = benchmark_config(name) if name in list_benchmarks() else {}
        return records, task, own
    local = local_benchmark_file(name)
    _, records, own = load_benchmark(name, source_override=str(local) if local else None)
    return records, own["verifier"], own


def eval_settings(
    cfg: DictConfig, own: Mapping[str, Any], verifier: Any, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """n, temperature, top_p, max_tokens, verifier of one benchmark: the command's overrides,
    else the run's eval.* value, else the benchmark's own, else FALLBACK (see module docstring)."""
    out: dict[str, Any] = {}
    for key in ("n", "temperature", "top_p", "max_tokens"):
        values = [(overrides or {}).get(key), cfg.eval.get(key), own.get(key)]
        value = next((v for v in values if v is not None), FALLBACK.get(key))
        out[key] = value if value is not None else cfg.trainer.max_completion_length
    out["n"], out["max_tokens"] = int(out["n"]), int(out["max_tokens"])
    out["temperature"], out["top_p"] = float(out["temperature"]), float(out["top_p"])
    out["verifier"] = resolve_verifier(verifier)[0]
    out["engine"] = (overrides or {}).get("engine") or cfg.eval.get("engine") or "transformers"
    return out


def evaluate_model(
    model,
    tokenizer,
    cfg: DictConfig,
    out_dir: Path,
    *,
    step: int | None,
    intermediate: bool = False,
    force: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, dict]:
    """{benchmark: result} for every benchmark of cfg.eval: computed, or found under the same
    settings and step (then not recomputed unless `force`). The engine in the settings is the one
    `model` is (a `vllm.LLM` or a transformers model), whatever the config asked for."""
    task = build_task(cfg.task)
    chat_template = chat_template_present(model, tokenizer)
    if hasattr(task, "bind_chat"):  # a task whose prompts follow the model's chat template (reasoning_gym)
        task.bind_chat(chat_template)
    results = {}
    for name in cfg.eval.benchmarks:
        records, verifier, own = _benchmark(name, task, chat_template)
        s = {**eval_settings(cfg, own, verifier, overrides), "engine": engine_name(model)}
        found = find_eval_result(out_dir, name, s, step, final=not intermediate)
        if found is not None and not force:
            results[name] = found
            continue
        results[name] = evaluate_benchmark(
            model,
            tokenizer,
            verifier,
            records,
            n=s["n"],
            temperature=s["temperature"],
            top_p=s["top_p"],
            max_tokens=s["max_tokens"],
            batch_size=int(cfg.eval.batch_size),
            seed=int(cfg.seed),
            out_dir=out_dir,
            step=step,
            name=name,
            intermediate=intermediate,
        )
    return results


def evaluate_run(
    run_dir: Path, cfg: DictConfig, *, force: bool = False, overrides: Mapping[str, Any] | None = None
) -> dict[str, dict]:
    """Evaluate <run_dir>/final on every benchmark of cfg.eval (`overrides`: settings of the command)."""
    unknown = set(overrides or {}) - set(EVAL_SETTINGS)
    if unknown:
        raise ValueError(f"evaluation settings: unknown {sorted(unknown)}; valid: {list(EVAL_SETTINGS)}")
    final = model_to_evaluate(Path(run_dir), cfg)
    if ((overrides or {}).get("engine") or cfg.eval.get("engine")) == "vllm":
        model, tokenizer = _vllm_model(final, cfg), None
    else:
        model, tokenizer = load_model_and_tokenizer(str(final), dtype=cfg.model.dtype)
        model.eval()
        _to_rank_device(model, cfg)
    ckpt = last_checkpoint(run_dir)
    step = checkpoint_step(ckpt) if ckpt else int(cfg.trainer.max_steps)
    return evaluate_model(model, tokenizer, cfg, Path(run_dir), step=step, force=force, overrides=overrides)


def model_to_evaluate(run_dir: Path, cfg: DictConfig) -> Path | str:
    """<run_dir>/final, or for a run of 0 steps (`method=base`, stare_lab.core.controls) the starting
    checkpoint itself (its LoRA adapters, if any, are the identity before training: not applied)."""
    if not trains(cfg):
        return resolve_model_path(str(cfg.model.name_or_path))  # a hub name stays a name
    final = run_dir / FINAL_DIR
    if not final.is_dir():
        raise FileNotFoundError(f"{final} does not exist: the run has not finished training")
    return final


def _vllm_model(final: Path | str, cfg: DictConfig):
    """A vLLM engine over final/, in the policy's dtype unless trainer.vllm_dtype says otherwise, seeded
    from the run (stare_lab.training.vllm_engine: the same rules as the training engine)."""
    t = cfg.trainer
    return build_llm(
        str(final),
        dtype=t.get("vllm_dtype") or str(cfg.model.dtype),
        seed=int(cfg.seed),
        cpu=bool(t.use_cpu),
        gpu_memory_utilization=float(t.get("vllm_gpu_memory_utilization") or 0.3),
    )


def _to_rank_device(model, cfg: DictConfig) -> None:
    """A multi-process run evaluates on each rank's own GPU (cuda:LOCAL_RANK) unless it trains on
    the CPU; one process keeps the model where it is loaded."""
    if process_count() > 1 and torch.cuda.is_available() and not cfg.trainer.use_cpu:
        model.to(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")


class IntermediateEval(TrainerCallback):
    """Evaluate the training model every `eval.every_steps` optimizer steps (results with final=False)."""

    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        every = int(self.cfg.eval.every_steps)
        if every > 0 and state.global_step % every == 0 and state.global_step < state.max_steps:
            was_training = model.training
            model.eval()
            try:
                evaluate_model(
                    model, processing_class, self.cfg, self.run_dir, step=state.global_step, intermediate=True
                )
            finally:
                model.train(was_training)
        return control
