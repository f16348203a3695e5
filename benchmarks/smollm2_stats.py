"""What each statistics path costs at a real vocabulary: `model=smollm2` (SmolLM2-135M-Instruct, docs/models.md:
49,152 tokens, 30 layers, grouped-query heads 9 / 3), each arm's step time over plain TRL's step, both
measured in this one run.

Run: .venv/bin/python benchmarks/smollm2_stats.py [--steps 4] [--rounds 2] [--threads 2] [--tokens 16]

Every arm trains the same config (2 prompts × 4 rollouts per step, one micro-batch, completions forced to
exactly `--tokens` tokens with min_new_tokens so that no arm's rollouts get shorter as its policy moves)
with benchmarks/step_overhead.py's instrumented `step_times`, in interleaved rounds (each round starts
one arm later); the first step of each arm is dropped. The arms, by where their statistics come from
(docs/design.md, "Statistics"):

- plain TRL's `GRPOTrainer` (the baseline), and `full` (no statistics);
- generation: log-prob and entropy (top_entropy), attention entropy at the middle layer (anchor), JS to
  the group mean (ict), recorded while transformers samples;
- pass: the same three after generation, in one no-grad forward (`stats_at_generation=False`);
- old_logp_forward: top_entropy with num_iterations = 2, its statistics riding TRL's own old-log-prob
  forward, against plain TRL with num_iterations = 2 (which makes that forward too).

Printed per arm: the median step time and its ratio over plain TRL's (of the same num_iterations),
stare_lab's own work timed directly (statistics pass + rule, s/step), generation time (recording
included), and the estimate (plain step + own + generation − plain generation) / plain step: end-to-end
ratios move by several percent between identical arms on shared cores, so the directly timed parts are
the sharper measure of what a path adds.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_overhead import step_times  # noqa: E402

LAYOUT = [
    "model=smollm2",
    "trainer.per_device_train_batch_size=8",
    "trainer.num_generations=4",
    "trainer.gradient_accumulation_steps=1",
]
PASS = {"stats_at_generation": False}
ITER2 = ["trainer.num_iterations=2"]
# name: (rule or None for plain TRL, trainer attributes, extra overrides, the plain-TRL arm it is put over)
ARMS: dict[str, tuple[str | None, dict, list[str], str]] = {
    "plain TRL": (None, {}, [], "plain TRL"),
    "full (none)": ("full", {}, [], "plain TRL"),
    "top_entropy, generation": ("top_entropy", {}, [], "plain TRL"),
    "top_entropy, pass": ("top_entropy", PASS, [], "plain TRL"),
    "anchor, generation": ("anchor", {}, [], "plain TRL"),
    "anchor, pass": ("anchor", PASS, [], "plain TRL"),
    "ict, generation": ("ict", {}, ["method.params.warmup_steps=0"], "plain TRL"),
    "ict, pass": ("ict", PASS, ["method.params.warmup_steps=0"], "plain TRL"),
    "plain TRL, num_iterations 2": (None, {}, ITER2, "plain TRL, num_iterations 2"),
    "top_entropy, old_logp_forward": ("top_entropy", {}, ITER2, "plain TRL, num_iterations 2"),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=16)
    a = p.parse_args()
    import torch

    from stare_lab.launchers.threads import busy_elsewhere

    torch.set_num_threads(a.threads)
    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; cores other processes kept busy at the start: {busy_elsewhere():.1f}"
    )
    step_times("full", 2, a.tokens, LAYOUT)  # first-use costs (allocator, the model's first load) out of the way
    names = list(ARMS)
    times: dict[str, list[float]] = {n: [] for n in names}
    own: dict[str, list[float]] = {n: [] for n in names}
    gen: dict[str, list[float]] = {n: [] for n in names}
    for i in range(a.rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            rule, attrs, extra, _ = ARMS[name]
            t, spent, g, _cpu = step_times(rule, a.steps, a.tokens, [*LAYOUT, *extra], attrs)
            print(f"round {i + 1}: {name}: steps {[round(x, 2) for x in t]} s, own {spent:.3f} s/step", flush=True)
            times[name] += t
            own[name].append(spent)
            gen[name].append(g)
    print(
        f"\n{a.rounds} interleaved rounds × {a.steps - 1} timed steps per arm; SmolLM2-135M-Instruct, 8 rollouts "
        f"of exactly {a.tokens} tokens per step"
    )
    print("estimate = (plain TRL's step + own + generation − plain TRL's generation) / plain TRL's step")
    print("| arm | step (s, median) | over plain TRL | own (s/step) | generation (s/step) | estimate |")
    print("|---|---|---|---|---|---|")
    for name in names:
        plain = ARMS[name][3]
        base, med = statistics.median(times[plain]), statistics.median(times[name])
        spent, g = statistics.median(own[name]), statistics.median(gen[name])
        estimate = (base + spent + g - statistics.median(gen[plain])) / base
        print(f"| {name} | {med:.2f} | {med / base:.3f} | {spent:.3f} | {g:.2f} | {estimate:.3f} |")


if __name__ == "__main__":
    main()
