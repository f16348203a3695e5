"""Step time with the colocated vLLM engine on CPU: plain TRL GRPOTrainer + vLLM, then each rule's
step time over it, and the colocated engine's memory. Run in the vllm environment:

    make bench-vllm        # = .venv-vllm/bin/python benchmarks/vllm_step.py [--steps 6] [--rules ...]

One engine for all trainers (stare_lab.vllm_engine.reuse_engines; TRL syncs the weights before every
generation). Step time is the median of transformers' `step_time` over the steps after the first;
trainers are timed in interleaved rounds so a neighbour's load hits all of them alike. Prints one
table; docs/vllm.md quotes it with the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from transformers import TrainerCallback

SETTINGS = [
    "trainer.use_vllm=true",
    "trainer.vllm_gpu_memory_utilization=0.1",
    "trainer.per_device_train_batch_size=16",
    "trainer.num_generations=8",
    "trainer.gradient_accumulation_steps=1",
    "trainer.max_completion_length=24",
    "trainer.save_steps=1000",
    "logger=none",
    "eval.enabled=false",
]
RULES = ["full", "top_entropy", "anchor", "ict"]
EXTRA = {"ict": ["method.params.warmup_steps=1"]}


def rss_gib() -> float:
    import psutil

    p = psutil.Process()
    return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)]) / 2**30


def plain_trl(cfg, out: Path):
    from trl import GRPOTrainer

    from stare_lab.models import load_model_and_tokenizer
    from stare_lab.runner import build_grpo_config, task_reward
    from stare_lab.tasks import build_task

    task = build_task(cfg.task)
    model, tok = load_model_and_tokenizer(cfg.model.name_or_path, dtype=cfg.model.dtype)
    return GRPOTrainer(
        model=model,
        reward_funcs=[task_reward(task)],
        args=build_grpo_config(cfg, out),
        train_dataset=task.train_dataset(),
        processing_class=tok,
    )


class CpuClock(TrainerCallback):
    """CPU seconds of this process per optimizer step (generation included: the colocated engine runs
    in-process). On a machine shared with other users, wall time measures their load more than ours."""

    def __init__(self):
        self.steps: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(time.process_time() - self._start)


def step_times(trainer, steps: int) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds of `steps` fresh optimizer steps (train() restarts its state); the engine is
    re-synced first, as another trainer wrote its own weights into the shared engine meanwhile."""
    clock = CpuClock()
    trainer.add_callback(clock)
    trainer.args.max_steps = steps
    trainer._last_loaded_step = -1
    try:
        trainer.train()
    finally:
        trainer.remove_callback(clock)
    wall = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
    return wall[-steps:], clock.steps[-steps:]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4, help="timed steps per trainer per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rules", nargs="*", default=RULES)
    a = p.parse_args()
    from stare_lab import vllm_engine
    from stare_lab.config import compose
    from stare_lab.runner import build_trainer

    vllm_engine.reuse_engines()
    tmp = Path(tempfile.mkdtemp(prefix="vllm_step_"))
    before = rss_gib()
    t0 = time.perf_counter()
    trainers = {"trl+vllm": plain_trl(compose(["method=full", *SETTINGS]), tmp / "plain")}
    startup = time.perf_counter() - t0
    engine_mem = rss_gib() - before
    llm = trainers["trl+vllm"].vllm_generation.llm
    for rule in a.rules:
        cfg = compose([f"method={rule}", *SETTINGS, *EXTRA.get(rule, [])])
        trainers[rule] = build_trainer(cfg, tmp / rule)
    times: dict[str, list[float]] = {k: [] for k in trainers}
    cpu: dict[str, list[float]] = {k: [] for k in trainers}
    for tr in trainers.values():  # warm-up: first step (allocations, first sync) not timed
        step_times(tr, 1)
    for _ in range(a.rounds):
        for name, tr in trainers.items():
            wall, used = step_times(tr, a.steps)
            times[name] += wall
            cpu[name] += used
    base, cpu_base = statistics.median(times["trl+vllm"]), statistics.median(cpu["trl+vllm"])
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}")
    print(f"engine start-up (first trainer, engine included): {startup:.1f} s")
    print(f"colocated engine + policy, resident memory added: {engine_mem:.2f} GiB")
    kv = llm.llm_engine.vllm_config.cache_config
    print(f"KV cache: {kv.num_gpu_blocks} blocks x {kv.block_size} tokens (gpu_memory_utilization 0.1)")
    print(f"{'trainer':<14}{'wall s/step':>12}{'ratio':>8}{'CPU s/step':>12}{'ratio':>8}{'n':>4}")
    for name, ts in times.items():
        m, c = statistics.median(ts), statistics.median(cpu[name])
        print(f"{name:<14}{m:>12.3f}{m / base:>8.3f}{c:>12.3f}{c / cpu_base:>8.3f}{len(ts):>4}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
