"""Step time with the colocated vLLM engine on CPU: plain TRL GRPOTrainer + vLLM, then each rule's
step time over it, and the colocated engine's memory. Run in the vllm environment:

    make bench-vllm        # = .venv-vllm/bin/python benchmarks/vllm_step.py [--steps 6] [--rules ...]

One engine for all trainers (stare_lab.training.vllm_engine.reuse_engines; TRL syncs the weights before every
generation). Step time is the median of transformers' `step_time` over the steps after the first;
trainers are timed in interleaved rounds so a neighbour's load hits all of them alike. Prints one
table; docs/vllm.md quotes it with the machine.

Every rollout is exactly `--completion-tokens` long (vLLM's `ignore_eos`, 0: the task's own ≤ 24):
otherwise each rule's policy drifts from plain TRL's after its first update, its rollouts change
length and its generation time with them, which is no cost of the rule. (Not `min_tokens`: vLLM masks
the end token until then and reports the log-probs of that masked distribution, so the sampled tokens
after an answer the policy wants to end have log p ≈ −14 under the policy, the IS ratio ≈ 1e-7, and
TRL's correction zeroes the loss. With `ignore_eos` the log-probs are the policy's (the first step's
IS ratio is 1.000); TRL's vLLM path masks nothing inside a returned completion, so every row trains on
all its tokens, as `min_new_tokens` makes them in benchmarks/step_overhead.py.) Beside the end-to-end ratio,
what a rule adds to the step is timed directly: TRL's no-grad old-log-prob forward (the vLLM
importance-sampling correction makes one; a rule's statistics ride it, `signals/sources.py`) against
plain TRL's, plus the rule and its TokenStats (`own`); estimate = (plain + forward − plain's forward +
own) / plain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from step_overhead import _timed, _timed_no_grad  # the same timers (this script's folder is on sys.path)
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
    from stare_lab.run.runner import build_grpo_config
    from stare_lab.tasks import build_task
    from stare_lab.tasks.rewards import verifier_reward

    task = build_task(cfg.task)
    model, tok = load_model_and_tokenizer(cfg.model.name_or_path, dtype=cfg.model.dtype)
    return GRPOTrainer(
        model=model,
        reward_funcs=[verifier_reward(task)],
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


class Parts:
    """Per-call times of one trainer's parts: TRL's no-grad old-log-prob forward (or the statistics riding
    it) and stare_lab's own work (TokenStats + the rule; a loss-changing rule's terms in the loss)."""

    def __init__(self, trainer, ours: bool):
        self.forward: list[float] = []
        self.own: list[float] = []
        trainer._get_per_token_logps_and_entropies = _timed_no_grad(
            trainer._get_per_token_logps_and_entropies, self.forward
        )
        if ours:
            trainer._rows_statistics = _timed(trainer._rows_statistics, self.forward)  # riding TRL's forward
            trainer._token_stats = _timed(trainer._token_stats, self.own)
            trainer._microbatch_weights = _timed(trainer._microbatch_weights, self.own)
            rule = trainer.rule
            call, terms = _timed(rule.__call__, self.own), _timed(rule.loss_terms, self.own)

            class Timed:
                def __getattr__(self, name):
                    return getattr(rule, name)

                def __call__(self, stats, state):
                    return call(stats, state)

                def loss_terms(self, batch):
                    return terms(batch)

            if not trainer.selects_in_loss:
                trainer.rule = Timed()

    def per_step(self, sink: list[float], steps: int) -> float:
        value = sum(sink) / max(steps, 1)
        sink.clear()
        return value


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
    p.add_argument("--completion-tokens", type=int, default=24, help="every rollout exactly this long (0: ≤ 24)")
    a = p.parse_args()
    settings = list(SETTINGS)
    if a.completion_tokens:
        settings += [
            f"trainer.max_completion_length={a.completion_tokens}",
            "+trainer.generation_kwargs.ignore_eos=true",
        ]
    from stare_lab.config.run_config import compose
    from stare_lab.run.runner import build_trainer
    from stare_lab.training import vllm_engine

    vllm_engine.reuse_engines()
    tmp = Path(tempfile.mkdtemp(prefix="vllm_step_"))
    before = rss_gib()
    t0 = time.perf_counter()
    trainers = {"trl+vllm": plain_trl(compose(["method=full", *settings]), tmp / "plain")}
    startup = time.perf_counter() - t0
    engine_mem = rss_gib() - before
    llm = trainers["trl+vllm"].vllm_generation.llm
    for rule in a.rules:
        cfg = compose([f"method={rule}", *settings, *EXTRA.get(rule, [])])
        trainers[rule] = build_trainer(cfg, tmp / rule)
    times: dict[str, list[float]] = {k: [] for k in trainers}
    cpu: dict[str, list[float]] = {k: [] for k in trainers}
    parts = {name: Parts(tr, ours=name != "trl+vllm") for name, tr in trainers.items()}
    forward: dict[str, list[float]] = {k: [] for k in trainers}
    own: dict[str, list[float]] = {k: [] for k in trainers}
    for name, tr in trainers.items():  # warm-up: first step (allocations, first sync) not timed
        step_times(tr, 1)
        parts[name].forward.clear()
        parts[name].own.clear()
    names = list(trainers)
    for i in range(a.rounds):
        # each round starts one trainer later, so no trainer always runs first
        for name in names[i % len(names) :] + names[: i % len(names)]:
            wall, used = step_times(trainers[name], a.steps)
            times[name] += wall
            cpu[name] += used
            forward[name].append(parts[name].per_step(parts[name].forward, a.steps))
            own[name].append(parts[name].per_step(parts[name].own, a.steps))
    base, cpu_base = statistics.median(times["trl+vllm"]), statistics.median(cpu["trl+vllm"])
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}")
    print(f"engine start-up (first trainer, engine included): {startup:.1f} s")
    print(f"colocated engine + policy, resident memory added: {engine_mem:.2f} GiB")
    kv = llm.llm_engine.vllm_config.cache_config
    print(f"KV cache: {kv.num_gpu_blocks} blocks x {kv.block_size} tokens (gpu_memory_utilization 0.1)")
    length = f"exactly {a.completion_tokens}" if a.completion_tokens else "≤ 24"
    print(f"rollouts of {length} tokens; forward: TRL's no-grad old-log-prob forward (statistics riding it)")
    print("| trainer | wall s/step | ratio | CPU s/step | ratio | forward s/step | own s/step | estimate | n |")
    print("|---|---|---|---|---|---|---|---|---|")
    fwd_base = statistics.median(forward["trl+vllm"])
    for name, ts in times.items():
        m, c = statistics.median(ts), statistics.median(cpu[name])
        f, o = statistics.median(forward[name]), statistics.median(own[name])
        est = (base + f - fwd_base + o) / base
        print(
            f"| {name} | {m:.3f} | {m / base:.3f} | {c:.3f} | {c / cpu_base:.3f} | {f:.4f} | {o:.4f} | {est:.3f} "
            f"| {len(ts)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
