"""One run, start to finish: train (resuming from the last checkpoint) and evaluate.

`execute(run_dir)` reads `run_dir/config.yaml` and writes metrics.jsonl, checkpoints/, final/,
eval/ and wandb/ beside it (docs/run_record.md). It does not touch status.json: the sweep worker
does that. Re-running a finished run redoes nothing; an interrupted one resumes from its last
checkpoint with its rule state, and metrics rows after that checkpoint are dropped first so no
step is logged twice.
"""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import TrainerCallback

from stare_lab.config import load_config

FINAL_DIR = "final"
CHECKPOINT_DIR = "checkpoints"


def last_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (one with trainer_state.json) under run_dir/checkpoints."""
    root = Path(run_dir) / CHECKPOINT_DIR
    found = []
    for d in root.glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", d.name)
        if m and (d / "trainer_state.json").is_file():
            found.append((int(m.group(1)), d))
    return max(found)[1] if found else None


def execute(run_dir: Path | str) -> None:
    run_dir = Path(run_dir)
    cfg = load_config(run_dir / "config.yaml")
    if not (run_dir / FINAL_DIR / "config.json").is_file():
        train(cfg, run_dir)
    if cfg.eval.enabled:
        from stare_lab.eval_run import evaluate_run

        evaluate_run(run_dir, cfg)


def build_grpo_config(cfg: DictConfig, output_dir: Path):
    from trl import GRPOConfig

    t = cfg.trainer
    return GRPOConfig(
        output_dir=str(output_dir), seed=int(cfg.seed), data_seed=int(cfg.seed),
        max_steps=t.max_steps, learning_rate=t.learning_rate, lr_scheduler_type=t.lr_scheduler_type,
        warmup_steps=t.warmup_steps, weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm,
        num_generations=t.num_generations, per_device_train_batch_size=t.per_device_train_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps, steps_per_generation=t.steps_per_generation,
        num_iterations=t.num_iterations, max_completion_length=t.max_completion_length,
        temperature=t.temperature, top_p=t.top_p, loss_type=t.loss_type, beta=t.beta,
        epsilon=t.epsilon, epsilon_high=t.epsilon_high, scale_rewards=t.scale_rewards,
        save_strategy="steps", save_steps=t.save_steps, save_total_limit=t.save_total_limit,
        logging_steps=t.logging_steps, use_cpu=t.use_cpu, bf16=t.bf16,
        gradient_checkpointing=t.gradient_checkpointing, use_vllm=t.use_vllm,
        generation_kwargs=OmegaConf.to_container(t.generation_kwargs, resolve=True) or None,
        report_to="none", disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
    )


def build_trainer(cfg: DictConfig, run_dir: Path, callbacks=()):
    """The configured TokenRuleGRPOTrainer for this run (model, task, rule, TRL config)."""
    from transformers import set_seed

    from stare_lab.methods import RuleState, get_method
    from stare_lab.models import load_model_and_tokenizer
    from stare_lab.tasks import build_task
    from stare_lab.trainer import TokenRuleGRPOTrainer

    set_seed(int(cfg.seed))
    task = build_task(cfg.task)
    m = cfg.model
    lora = OmegaConf.to_container(m.lora, resolve=True) if m.lora is not None else None
    model, tokenizer = load_model_and_tokenizer(m.name_or_path, dtype=m.dtype, lora=lora,
                                                attn_implementation=m.attn_implementation)
    rule = get_method(cfg.method.name, **OmegaConf.to_container(cfg.method.params, resolve=True))
    t = cfg.trainer
    return TokenRuleGRPOTrainer(
        model=model, reward_funcs=[task_reward(task)], args=build_grpo_config(cfg, run_dir / CHECKPOINT_DIR),
        train_dataset=task.train_dataset(), processing_class=tokenizer, callbacks=list(callbacks),
        rule=rule, rule_state=RuleState(seed=int(cfg.seed), total_steps=t.max_steps),
        grad_geometry_every=t.grad_geometry_every, stats_chunk_tokens=t.stats_chunk_tokens,
        attn_chunk_queries=t.attn_chunk_queries, js_chunk_positions=t.js_chunk_positions,
    )


def task_reward(task):
    """The task's verifier as a TRL reward function named `accuracy` (logged as rewards/accuracy/mean)."""
    def accuracy(completions, answer, **kwargs):
        return task.reward(completions, answer, **kwargs)

    return accuracy


def train(cfg: DictConfig, run_dir: Path) -> None:
    from transformers.trainer_callback import PrinterCallback

    from stare_lab.tracking import METRICS_FILE, MetricsLogger, StepPrinter, init_wandb, truncate_metrics

    ckpt = last_checkpoint(run_dir)
    if ckpt is not None:
        truncate_metrics(run_dir / METRICS_FILE, int(ckpt.name.split("-")[1]))
    elif (run_dir / METRICS_FILE).exists():
        (run_dir / METRICS_FILE).unlink()  # a run that died before its first checkpoint starts over
    wandb_run = init_wandb(cfg, run_dir)
    from stare_lab.eval_run import IntermediateEval

    callbacks = [MetricsLogger(run_dir, wandb_run)]
    if cfg.eval.enabled and cfg.eval.every_steps > 0:
        callbacks.append(IntermediateEval(cfg, run_dir))
    fail_at = os.environ.get("STARE_LAB_FAIL_AT_STEP")
    if fail_at:
        callbacks.append(_FailAt(int(fail_at)))
    callbacks.append(StepPrinter(f"{cfg.method.name} s{cfg.seed}"))
    try:
        trainer = build_trainer(cfg, run_dir, callbacks)
        trainer.remove_callback(PrinterCallback)
        if ckpt is not None:
            trainer.load_rule_state(ckpt)
        trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
        final = run_dir / FINAL_DIR
        tmp = run_dir / (FINAL_DIR + ".tmp")
        trainer.save_model(str(tmp))
        trainer.processing_class.save_pretrained(str(tmp))
        if final.exists():
            import shutil

            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        if wandb_run is not None:
            wandb_run.finish()


class _FailAt(TrainerCallback):
    """Test hook (env STARE_LAB_FAIL_AT_STEP=N): raise at optimizer step N, like a crashing job."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            raise RuntimeError(f"STARE_LAB_FAIL_AT_STEP: simulated crash at step {state.global_step}")
        return control


# TRL 1.16 itself still uses transformers' deprecated gradient_checkpointing names.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
torch.set_num_threads(max(1, min(torch.get_num_threads(), int(os.environ.get("STARE_LAB_THREADS", "64")))))
