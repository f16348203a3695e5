"""Evaluation of a run: its final model on each configured benchmark (and, optionally, on
intermediate checkpoints during training, for curves). Results land in <run_dir>/eval/
(docs/run_record.md); a benchmark already evaluated is not redone unless forced.
"""
from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig
from transformers import TrainerCallback

from stare_lab.record import FINAL_DIR, checkpoint_step, eval_result_dir, last_checkpoint

def local_benchmark_file(name: str) -> Path | None:
    """A local copy of a benchmark (no hub access needed): $STARE_LAB_BENCHMARKS/<name>.jsonl, else
    the copy shipped in the package (stare_lab.config.BENCHMARK_DATA_DIR)."""
    from stare_lab import config

    for root in (os.environ.get("STARE_LAB_BENCHMARKS"), getattr(config, "BENCHMARK_DATA_DIR", None)):
        if root and (Path(root) / f"{name}.jsonl").is_file():
            return Path(root) / f"{name}.jsonl"
    return None


def _benchmark(name: str, cfg: DictConfig, task):
    """(records, verifier) of one benchmark; the run's own task supplies its held-out split."""
    from stare_lab.evaluation import load_benchmark

    if name == task.name and hasattr(task, "heldout_dataset"):
        records = [{"prompt": r["prompt"], "problem": r["prompt"], "answer": str(r["answer"]),
                    "problem_id": str(r["problem_id"])} for r in task.heldout_dataset()]
        return records, task
    local = local_benchmark_file(name)
    _, records, settings = load_benchmark(name, source_override=str(local) if local else None)
    return records, settings["verifier"]


def evaluate_model(model, tokenizer, cfg: DictConfig, out_dir: Path, *, step: int | None,
                   intermediate: bool = False, force: bool = False) -> dict[str, dict]:
    from stare_lab.evaluation import evaluate_benchmark
    from stare_lab.tasks import build_task

    task = build_task(cfg.task)
    e = cfg.eval
    results = {}
    for name in e.benchmarks:
        dest = eval_result_dir(out_dir, step if intermediate else None) / f"{name}.json"
        if dest.is_file() and not force:
            continue
        records, verifier = _benchmark(name, cfg, task)
        results[name] = evaluate_benchmark(
            model, tokenizer, verifier, records, n=int(e.n), temperature=float(e.temperature), top_p=float(e.top_p),
            max_tokens=int(e.max_tokens or cfg.trainer.max_completion_length), batch_size=int(e.batch_size),
            seed=int(cfg.seed), out_dir=out_dir, step=step, name=name, intermediate=intermediate)
    return results


def evaluate_run(run_dir: Path, cfg: DictConfig, *, force: bool = False) -> dict[str, dict]:
    """Evaluate <run_dir>/final on every benchmark of cfg.eval."""
    from stare_lab.models import load_model_and_tokenizer

    final = Path(run_dir) / FINAL_DIR
    if not final.is_dir():
        raise FileNotFoundError(f"{final} does not exist: the run has not finished training")
    model, tokenizer = load_model_and_tokenizer(str(final), dtype=cfg.model.dtype)
    model.eval()
    ckpt = last_checkpoint(run_dir)
    step = checkpoint_step(ckpt) if ckpt else int(cfg.trainer.max_steps)
    return evaluate_model(model, tokenizer, cfg, Path(run_dir), step=step, force=force)


class IntermediateEval(TrainerCallback):
    """Evaluate the training model every `eval.every_steps` optimizer steps (eval/step-<N>/)."""

    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        every = int(self.cfg.eval.every_steps)
        if every > 0 and state.global_step % every == 0 and state.global_step < state.max_steps:
            was_training = model.training
            model.eval()
            try:
                evaluate_model(model, processing_class, self.cfg, self.run_dir, step=state.global_step,
                               intermediate=True)
            finally:
                model.train(was_training)
        return control
