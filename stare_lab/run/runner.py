"""One run, start to finish: train (resuming from the last checkpoint) and evaluate.

`execute(run_dir)` reads `run_dir/config.yaml` and writes metrics.jsonl, checkpoints/, final/,
eval/ and wandb/ beside it (docs/run_record.md, file names in stare_lab.record). It does not
touch status.json: the sweep worker does that. Re-running a finished run redoes nothing; an
interrupted one resumes from its newest readable checkpoint with its rule state, and metrics rows
after that checkpoint are dropped first so no step is logged twice. A run whose loss or weights
become NaN/inf stops at that step with `NonFiniteError` (instead of failing a step later in the
sampler).
"""

from __future__ import annotations

import datetime
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import PartialState
from omegaconf import DictConfig
from transformers import TrainerCallback, set_seed
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig

from stare_lab.config.run_config import load_config
from stare_lab.core.controls import trains
from stare_lab.core.utils import plain_dict
from stare_lab.evaluation.run_eval import IntermediateEval, evaluate_run
from stare_lab.methods import RuleState, get_method
from stare_lab.methods.outside import import_run_modules
from stare_lab.models import load_model_and_tokenizer
from stare_lab.record import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    FINAL_DIR,
    checkpoint_step,
    checkpoint_world_size,
    checkpoints,
    last_checkpoint,
    metrics_path,
    process_count,
    process_rank,
    read_metrics,
    truncate_metrics,
    write_metrics,
    write_task_record,
)
from stare_lab.record.kept_batch import kept_steps
from stare_lab.serving.vllm_server import for_run
from stare_lab.tasks import build_task
from stare_lab.tasks.rewards import training_rewards
from stare_lab.training.learning_signal import LearningSignalCheck
from stare_lab.training.tracking import MetricsLogger, StepPrinter, is_train_log, metrics_row
from stare_lab.training.trainer import TokenRuleGRPOTrainer
from stare_lab.training.vllm_engine import grpo_vllm_args
from stare_lab.viewer.wandb_export import init_wandb, publish_run

# Logged values that are finite in every healthy step; rule metrics (e.g. a closed gate's NaN) are not checked.
FINITE_KEYS = ("loss", "grad_norm", "tokens/weight_mean", "tokens/weight_std")


class NonFiniteError(RuntimeError):
    """The loss, gradient norm, token weights or model weights became NaN/inf."""


def execute(run_dir: Path | str, callbacks: Sequence[TrainerCallback] = ()) -> None:
    """Train (unless final/ exists) and evaluate the run in `run_dir`. `callbacks` are extra
    TrainerCallbacks, e.g. a test's crash at a given step. With several processes every rank
    calls it (RANK/WORLD_SIZE exported by the worker); rank 0 alone writes the record."""
    run_dir = Path(run_dir)
    cfg = load_config(run_dir / CONFIG_FILE)
    import_run_modules(
        cfg.get("run")
    )  # rules kept outside the package register (every rank; stare_lab.methods.outside)
    processes = int(cfg.run.get("processes") or 1)  # a config written before the key existed: 1
    if processes != process_count():
        raise ValueError(
            f"run.processes = {processes}, but this run has {process_count()} process(es): "
            "start it through `sweep run` with the launcher that expanded it"
        )
    # a run of 0 steps (method=base, stare_lab.core.controls) evaluates its starting checkpoint: no trainer
    trained = not trains(cfg) or (run_dir / FINAL_DIR / "config.json").is_file()
    if trained and not cfg.eval.enabled:
        return
    # One W&B run object from the first step to the token page: no second init, finish and
    # offline folder per run for the evaluation, as resuming it after training took.
    wandb_run = _open_wandb(cfg, run_dir)
    try:
        if not trained:
            with for_run(cfg, run_dir) as server_watch:  # server mode: its address, its watch; else nothing
                train(cfg, run_dir, [*callbacks, *server_watch], wandb_run)
        if cfg.eval.enabled:
            evaluate(cfg, run_dir, wandb_run)
    finally:
        if wandb_run is not None:
            wandb_run.finish()


def _open_wandb(cfg: DictConfig, run_dir: Path):
    """The run's W&B run on rank 0 (None on the other ranks and when W&B is off)."""
    return init_wandb(cfg, run_dir) if process_rank() == 0 else None


def evaluate(cfg: DictConfig, run_dir: Path, wandb_run=None) -> None:
    """Evaluate final/ (every rank); on rank 0, draw the run's selection figures into
    <run_dir>/figures/ when it kept batches (so that `stare-lab plot` copies them rather than drawing
    every run's at once), and publish the results and the token page into the run's W&B record (into
    `wandb_run`, left open)."""
    if process_count() > 1:
        join_processes(cfg)
    evaluate_run(run_dir, cfg)
    if process_rank() == 0:
        if kept_steps(run_dir):  # ~1 s of CPU per run; W&B's token page logs the same files
            from stare_lab.viewer.figures import plot_selection  # deferred: matplotlib, only a run that kept batches

            plot_selection(run_dir, run_dir / "figures", processes=1)
    if wandb_run is not None:
        publish_run(run_dir, run=wandb_run)


def join_processes(cfg: DictConfig) -> None:
    """torch.distributed for a multi-process evaluation whose training was done by an earlier
    attempt (training starts it through accelerate; so does this, with the same timeout)."""
    if not dist.is_initialized():
        PartialState(
            cpu=bool(cfg.trainer.use_cpu),
            timeout=datetime.timedelta(seconds=int(cfg.trainer.get("ddp_timeout_s") or 1800)),
        )


def build_grpo_config(cfg: DictConfig, output_dir: Path):
    t = cfg.trainer
    return GRPOConfig(
        output_dir=str(output_dir),
        seed=int(cfg.seed),
        data_seed=int(cfg.seed),
        max_steps=t.max_steps,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler_type,
        warmup_steps=t.warmup_steps,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        num_generations=t.num_generations,
        per_device_train_batch_size=t.per_device_train_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        steps_per_generation=t.steps_per_generation,
        num_iterations=t.num_iterations,
        max_completion_length=t.max_completion_length,
        temperature=t.temperature,
        top_p=t.top_p,
        loss_type=t.loss_type,
        beta=t.beta,
        epsilon=t.epsilon,
        epsilon_high=t.epsilon_high,
        delta=t.get("delta"),
        scale_rewards=t.scale_rewards,
        save_strategy="steps",
        save_steps=t.save_steps,
        save_total_limit=t.save_total_limit,
        logging_steps=t.logging_steps,
        use_cpu=t.use_cpu,
        bf16=t.bf16,
        gradient_checkpointing=t.gradient_checkpointing,
        # vLLM keys (and the engine's dtype, seed and CPU workaround) from one place: stare_lab.training.vllm_engine
        **grpo_vllm_args(t, str(cfg.model.dtype), int(cfg.seed)),
        generation_kwargs=plain_dict(t.generation_kwargs) or None,
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        ddp_timeout=int(t.get("ddp_timeout_s") or 1800),
        **engine_args(t.get("distributed") or "ddp"),
    )


def engine_args(engine: str) -> dict:
    """TrainingArguments of `trainer.distributed` for a multi-process run (accelerate builds its
    FSDP or DeepSpeed plugin from them); nothing for ddp or one process."""
    if process_count() <= 1 or engine == "ddp":
        return {}
    if engine == "fsdp":
        # FSDP2 (transformers 5's default), each decoder layer (the model's `_no_split_modules`) one
        # unit, parameters resharded after each forward; checkpoints and final/ hold full weights
        return {
            "fsdp": True,
            "fsdp_config": {
                "version": 2,
                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "reshard_after_forward": True,
                "state_dict_type": "FULL_STATE_DICT",
                "cpu_ram_efficient_loading": False,
            },
        }
    stage = {"deepspeed_zero2": 2, "deepspeed_zero3": 3}[engine]
    zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if stage == 3:  # final/ holds the whole model, gathered from the shards
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "deepspeed": {
            "zero_optimization": zero,
            "bf16": {"enabled": "auto"},
            "fp16": {"enabled": "auto"},
            "train_micro_batch_size_per_gpu": "auto",
            "train_batch_size": "auto",
            "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto",
            "zero_allow_untested_optimizer": True,
        }
    }


def build_trainer(cfg: DictConfig, run_dir: Path, callbacks=()):
    """The configured TokenRuleGRPOTrainer for this run (model, task, rule, TRL config)."""
    set_seed(int(cfg.seed))
    task = build_task(cfg.task)
    m = cfg.model
    lora = plain_dict(m.lora) if m.lora is not None else None
    model, tokenizer = load_model_and_tokenizer(
        m.name_or_path, dtype=m.dtype, lora=lora, attn_implementation=m.attn_implementation
    )
    if hasattr(task, "bind_tokenizer"):  # chat: auto follows the model's chat template (reasoning_gym)
        task.bind_tokenizer(tokenizer)
    train_dataset = task.train_dataset()
    if hasattr(task, "split_record") and process_rank() == 0:  # its splits' sizes, seeds, collisions removed
        write_task_record(run_dir, task.split_record())
    rule = get_method(cfg.method.name, **plain_dict(cfg.method.params))
    t = cfg.trainer
    rewards, weights = training_rewards(task, plain_dict(cfg.task), int(cfg.seed))
    args = build_grpo_config(cfg, run_dir / CHECKPOINT_DIR)
    args.reward_weights = weights
    return TokenRuleGRPOTrainer(
        model=model,
        reward_funcs=rewards,
        args=args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        callbacks=list(callbacks),
        rule=rule,
        rule_state=RuleState(seed=int(cfg.seed), total_steps=t.max_steps),
        grad_geometry_every=t.grad_geometry_every,
        stats_chunk_tokens=t.stats_chunk_tokens,
        attn_chunk_queries=t.attn_chunk_queries,
        js_chunk_positions=t.js_chunk_positions,
        keep_batches_every=t.keep_batches_every,
        run_dir=run_dir,
        microbatch_aggregation=t.microbatch_aggregation,
        microbatch_ranks=t.microbatch_ranks,
    )


def resume_point(run_dir: Path) -> Path | None:
    """The checkpoint to resume from, with metrics.jsonl cut back to it.

    Unreadable newer checkpoints (a save cut short) are named, renamed `corrupt-checkpoint-<N>`
    (kept, but out of the trainer's way) and the newest readable one is used. Rows the checkpoint
    logged but metrics.jsonl lacks (a torn last row) are restored from its trainer_state.json.
    """
    problems: list[str] = []
    ckpt = last_checkpoint(run_dir, problems)
    if ckpt is not None and checkpoint_world_size(ckpt) != process_count():
        raise ValueError(
            f"{ckpt.name} was written by {checkpoint_world_size(ckpt)} process(es) and this run has "
            f"{process_count()}: resume with the same processes (sharded optimizer state and per-rank "
            "RNG states do not reshard), or move checkpoints/ away to start over"
        )
    if process_rank() != 0:  # rank 0 alone repairs the record; every rank resumes from the same checkpoint
        return ckpt
    for bad, problem in zip(checkpoints(run_dir), problems, strict=False):  # the newest ones, up to the good one
        bad.rename(bad.with_name(f"corrupt-{bad.name}"))
        print(f"{run_dir.name}: {problem}; resuming from {ckpt.name if ckpt else 'the start'}", flush=True)
    metrics = metrics_path(run_dir)
    if ckpt is None:
        if metrics.exists():
            metrics.unlink()  # a run that died before its first checkpoint starts over
        return None
    _, kept = truncate_metrics(metrics, checkpoint_step(ckpt))
    if kept is not None:
        print(f"{run_dir.name}: metrics.jsonl had unreadable lines; the old file is kept as {kept.name}", flush=True)
    _restore_logged_rows(run_dir, ckpt)
    return ckpt


def _restore_logged_rows(run_dir: Path, ckpt: Path) -> None:
    have = {r["step"] for r in read_metrics(run_dir)}
    state = json.loads((ckpt / "trainer_state.json").read_text())
    when = (ckpt / "trainer_state.json").stat().st_mtime
    missing = [e for e in state.get("log_history", []) if is_train_log(e) and e.get("step") not in have]
    if not missing:
        return
    write_metrics(run_dir, read_metrics(run_dir) + [metrics_row(int(e["step"]), e, when) for e in missing])
    print(
        f"{run_dir.name}: restored metrics of step(s) {', '.join(str(e['step']) for e in missing)} from {ckpt.name}",
        flush=True,
    )


def train(cfg: DictConfig, run_dir: Path, callbacks: Sequence[TrainerCallback] = (), wandb_run=None) -> None:
    """Train from the last checkpoint to final/. `wandb_run`: rank 0's open W&B run (the caller finishes it)."""
    ckpt = resume_point(run_dir)
    main = process_rank() == 0  # one record per run: rank 0 writes metrics and W&B
    if ckpt is not None and process_count() > 1:
        print(f"{run_dir.name}: rank {process_rank()} resumes from {ckpt.name}", flush=True)
    all_callbacks: list[TrainerCallback] = [FiniteGuard()] + ([MetricsLogger(run_dir, wandb_run)] if main else [])
    if cfg.eval.enabled and cfg.eval.every_steps > 0:
        all_callbacks.append(IntermediateEval(cfg, run_dir))
    label = f"{cfg.method.name} s{cfg.seed}"
    all_callbacks += [*callbacks] + ([StepPrinter(label), LearningSignalCheck(label, wandb_run)] if main else [])
    trainer = build_trainer(cfg, run_dir, all_callbacks)
    trainer.remove_callback(PrinterCallback)
    if ckpt is not None:
        trainer.load_rule_state(ckpt)  # every rank: the rule state is the same on all of them
    trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
    final = run_dir / FINAL_DIR
    tmp = run_dir / (FINAL_DIR + ".tmp")
    trainer.save_model(str(tmp))  # every rank: FSDP and ZeRO-3 gather the shards to save
    if main:
        trainer.processing_class.save_pretrained(str(tmp))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    trainer.accelerator.wait_for_everyone()  # evaluation on every rank reads final/


class FiniteGuard(TrainerCallback):
    """Stops the run at the first step whose loss, gradient norm, token weights or model weights
    are NaN/inf. Checked after each optimizer step and each log, so the next generation never
    samples from a NaN policy (torch's sampler would fail a step later without saying why)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        bad = [
            f"{k}={logs[k]}"
            for k in FINITE_KEYS
            if isinstance((logs or {}).get(k), (int, float)) and not math.isfinite(logs[k])
        ]
        if bad:
            raise NonFiniteError(f"step {state.global_step}: {', '.join(bad)} became non-finite; run stopped")
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad] if model is not None else []
        if params and not bool(torch.stack([torch.isfinite(p.detach()).all() for _, p in params]).all()):
            names = [n for n, p in params if not bool(torch.isfinite(p.detach()).all())]
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            raise NonFiniteError(
                f"step {state.global_step}: the model weights became non-finite ({names[0]}{more}); run stopped"
            )
        return control
