"""Step-time overhead of each token rule over plain TRL GRPOTrainer, and attention-entropy memory.

Run: .venv/bin/python benchmarks/step_overhead.py [--steps 10] [--rounds 3] [--seq 2048] [--threads 1]
     [--num-iterations 2] [--scope microbatch]

1. Every rule and plain `trl.GRPOTrainer` train the built-in model with the same config (one
   torch thread: the least noisy setting on a laptop); the median wall time of an optimizer step
   (first step dropped) is measured in interleaved rounds in this one process and printed as a
   ratio over plain TRL. Because end-to-end step times of tiny steps move by several percent
   between identical configurations, stare_lab's own generation-time work (stats pass + rule) is
   also timed directly and shown as (plain step + that) / plain step.
2. Peak resident memory of one forward at a long sequence, each in a fresh subprocess: plain
   sdpa forward (baseline), our chunked attention entropy of one layer, and eager
   `output_attentions=True`. The extra memory over the baseline is compared.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from transformers import TrainerCallback  # noqa: E402

BENCH = [
    "trainer.per_device_train_batch_size=16",
    "trainer.num_generations=8",
    "trainer.gradient_accumulation_steps=2",
    "trainer.save_steps=1000",
    "logger=none",
    "eval.enabled=false",
]


def _timed_no_grad(fn, sink: list[float]):
    """Time only the no-grad calls (TRL's old-log-prob forward, or the statistics riding on it)."""
    import torch

    timed = _timed(fn, sink)
    return lambda *a, **k: fn(*a, **k) if torch.is_grad_enabled() else timed(*a, **k)


def _timed(fn, sink: list[float]):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t0)

    return wrapper


class TimedRule:
    """The configured rule with its calls timed (attributes such as `needs` pass through)."""

    def __init__(self, rule, sink: list[float]):
        self._rule, self._call = rule, _timed(rule.__call__, sink)
        self._loss_terms = _timed(rule.loss_terms, sink)

    def __getattr__(self, name):
        return getattr(self._rule, name)

    def __call__(self, stats, state):
        return self._call(stats, state)

    def loss_terms(self, batch):  # a loss-changing rule's terms, inside the loss
        return self._loss_terms(batch)


def step_times(
    rule: str | None, steps: int, tokens: int = 0, extra=(), attrs: dict | None = None
) -> tuple[list[float], float, float, list[float]]:
    """Wall time of each optimizer step after the first, stare_lab's own work (stats pass + rule at
    generation time; for scope microbatch/token the rule in the loss; for a loss-changing rule its terms
    and their addition to TRL's loss) per step, and transformers generation per step (with any statistics
    recorded in it), timed directly, and the CPU time of each step after the first. `attrs`: attributes
    set on our trainer before it trains (`stats_at_generation=False`: the statistics pass after generation)."""
    from trl import GRPOTrainer

    from stare_lab.config.run_config import compose
    from stare_lab.run.runner import build_grpo_config, build_trainer

    longer = (
        [f"trainer.max_completion_length={tokens}", f"+trainer.generation_kwargs.min_new_tokens={tokens}"]
        if tokens
        else []
    )
    cfg = compose(
        [
            f"method={rule or 'full'}",
            f"trainer.max_steps={steps}",
            *BENCH,
            *longer,
            *(e for e in extra if rule is not None or not e.startswith("method.")),
        ]
    )
    with tempfile.TemporaryDirectory() as d:
        trainer = build_trainer(cfg, Path(d))
        for name, value in (attrs or {}).items():
            setattr(trainer, name, value)
        if rule is None:  # plain TRL on the same model, data, reward and config
            trainer = GRPOTrainer(
                model=trainer.model,
                reward_funcs=[task_reward_from(trainer)],
                args=build_grpo_config(cfg, Path(d)),
                train_dataset=trainer.train_dataset,
                processing_class=trainer.processing_class,
            )
        from transformers.trainer_callback import PrinterCallback

        clock = StepClock()
        trainer.add_callback(clock)
        trainer.remove_callback(PrinterCallback)
        own: list[float] = []
        gen: list[float] = []
        patched: list[tuple] = []
        trainer._generate_single_turn = _timed(trainer._generate_single_turn, gen)
        trainer._get_per_token_logps_and_entropies = _timed_no_grad(trainer._get_per_token_logps_and_entropies, gen)
        if rule is not None:
            trainer._token_stats = _timed(trainer._token_stats, own)
            trainer._rows_statistics = _timed(trainer._rows_statistics, gen)  # riding TRL's old-log-prob forward
            trainer._microbatch_weights = _timed(trainer._microbatch_weights, own)  # scope microbatch, in the loss
            if not trainer.selects_in_loss:  # there the rule runs inside _microbatch_weights, already timed
                trainer.rule = TimedRule(trainer.rule, own)
            if trainer.rule.changes_loss:  # the rule's terms inside the loss: the rule (above) and what adds them
                from stare_lab.training import trl_loss

                for name in ("surrogate_change", "trl_aggregate", "own_term"):
                    patched.append((trl_loss, name, getattr(trl_loss, name)))
                    setattr(trl_loss, name, _timed(getattr(trl_loss, name), own))
                trainer._loss_batch = _timed(trainer._loss_batch, own)
                trainer._log_loss_terms = _timed(trainer._log_loss_terms, own)
        gc.collect()  # the previous trainer's garbage is not collected inside this one's timing
        try:
            trainer.train()
        finally:
            for module, name, original in patched:
                setattr(module, name, original)
    # the first step pays one-off costs
    return clock.times[1:], sum(own) / max(steps, 1), sum(gen) / max(steps, 1), clock.cpu[1:]


class StepClock(TrainerCallback):
    """Wall time and this process's CPU time of each optimizer step (generation, stats pass, rule,
    forward/backward, update). With one torch thread the CPU time leaves out what other processes and
    the hypervisor take from the core, most of the noise between identical arms on shared cores."""

    def __init__(self):
        self.times, self.cpu, self._t0, self._c0 = [], [], None, None

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0, self._c0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._t0)
        self.cpu.append(time.process_time() - self._c0)


def task_reward_from(trainer):
    return trainer.reward_funcs[0]


MEM_CHILD = r"""
import resource, sys, torch, json
from stare_lab.models.builtin import build_model, build_tokenizer
from stare_lab.signals import forward_with_stats
torch.set_num_threads(1)
mode, T, B = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tok = build_tokenizer()
model = build_model(tok, max_positions=T).eval()
ids = torch.randint(3, len(tok), (B, T)); mask = torch.ones(B, T, dtype=torch.long)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with torch.no_grad():
    if mode == "sdpa":
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    elif mode == "ae":
        out = forward_with_stats(model, ids, mask, ae_layers=(2,))  # as the trainer's stats pass
    else:
        model.set_attn_implementation("eager")
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True, use_cache=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"extra_kb": after - before}))
"""


def peak_memory(mode: str, T: int, B: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", MEM_CHILD, mode, str(T), str(B)], capture_output=True, text=True, cwd=REPO, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["extra_kb"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--rules", nargs="*", default=None)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: least noisy on a laptop)")
    p.add_argument(
        "--completion-tokens",
        type=int,
        default=0,
        help="force completions of exactly this many tokens (min_new_tokens); 0: the task's own ≤ 24. "
        "With 0 each arm's rollouts change length as its policy drifts from plain TRL's after the first "
        "update, and generation time with them (the 1.09× once quoted for STARE at scope microbatch)",
    )
    p.add_argument(
        "--num-iterations",
        type=int,
        default=None,
        help="TRL's num_iterations for every arm (2: TRL makes an old-log-prob forward); default: each "
        "rule's own (Lopti: 2 passes per generation batch, every other rule and plain TRL: 1)",
    )
    p.add_argument("--scope", default=None, help="e.g. microbatch: that scope for the rules that take it")
    p.add_argument(
        "--path-costs",
        action="store_true",
        help="only the statistics paths' own costs, in one process, interleaved repetitions (min time)",
    )
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--memory-only", action="store_true")
    a = p.parse_args()
    import platform

    import torch

    from stare_lab.methods import list_methods

    torch.set_num_threads(a.threads)

    rules = a.rules or list_methods()
    extra = [f"trainer.num_iterations={a.num_iterations}"] if a.num_iterations else []
    if a.scope:
        from stare_lab.methods import get_method
        from stare_lab.training.token_weights import MICROBATCH_STATISTICS

        def takes_scope(r: str) -> bool:
            try:
                get_method(r, scope=a.scope)
            except ValueError:
                return False
            return True

        rules = [
            r
            for r in rules
            if takes_scope(r) and (a.scope != "microbatch" or get_method(r).needs_for(None) <= MICROBATCH_STATISTICS)
        ]
        extra.append(f"method.params.scope={a.scope}")
    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )
    if a.memory_only:
        return memory(a.seq, a.batch)
    if a.path_costs:
        return path_costs()
    samples: dict[str, list[float]] = {"plain TRL": [], **{r: [] for r in rules}}
    cpu: dict[str, list[float]] = {"plain TRL": [], **{r: [] for r in rules}}
    own: dict[str, list[float]] = {}
    gen: dict[str, list[float]] = {"plain TRL": [], **{r: [] for r in rules}}
    for warm in (None, "anchor", "ict"):  # first-use costs (allocator, attention registration) out of the way
        step_times(warm, 2, a.completion_tokens, [e for e in extra if not e.startswith("method.")])
    arms: list[str | None] = [None, *rules]
    for i in range(a.rounds):
        # each round starts one arm later, so no arm always runs first (or right after the warm-up)
        for r in arms[i % len(arms) :] + arms[: i % len(arms)]:
            times, spent, g, used = step_times(r, a.steps, a.completion_tokens, extra)
            name = r or "plain TRL"
            samples[name] += times
            cpu[name] += used
            gen[name].append(g)
            if r is not None:
                own.setdefault(r, []).append(spent)
    base = statistics.median(samples["plain TRL"])
    length = f"exactly {a.completion_tokens}" if a.completion_tokens else "≤ 24"
    print(
        f"\n{a.rounds} interleaved rounds × {a.steps - 1} timed steps per rule; built-in model, "
        f"{BENCH[0].split('=')[1]} rollouts of {length} tokens per micro-batch, 2 micro-batches per step, "
        f"num_iterations={a.num_iterations or 'each rule’s own'}" + (f", scope={a.scope}" if a.scope else "")
    )
    print(
        "own = stats pass + rule after generation (in the loss for scope microbatch/token, with a "
        "loss-changing rule's terms); gen = transformers generation (recording included) and "
        "TRL's no-grad old-log-prob forward (statistics riding on it included), per step; "
        "estimate = (plain + own + gen − gen of plain TRL) / plain"
    )
    print(
        "| rule | step time (s, median) | ratio over plain TRL | CPU time ratio | own (s/step) | gen (s/step) "
        "| estimate |"
    )
    print("|---|---|---|---|---|---|---|")
    gen_plain = statistics.median(gen["plain TRL"])
    cpu_plain = statistics.median(cpu["plain TRL"])
    for name, ts in samples.items():
        med = statistics.median(ts)
        spent = statistics.median(own[name]) if name in own else 0.0
        g = statistics.median(gen[name])
        est = (base + spent + g - gen_plain) / base
        c = statistics.median(cpu[name]) / cpu_plain
        print(f"| {name} | {med:.3f} | {med / base:.3f} | {c:.3f} | {spent:.4f} | {g:.4f} | {est:.3f} |")
    if not a.skip_memory:
        memory(a.seq, a.batch)


def path_costs(reps: int = 30, rows: int = 16, new_tokens: int = 24) -> None:
    """What each statistics path adds, measured directly on the built-in model: transformers generation
    with and without recording, and TRL's fused old-log-prob forward against the statistics riding on it
    (the same rows, one no-grad forward each). Minimum over interleaved repetitions (load on a shared
    machine only ever adds time)."""
    import torch
    from transformers import Qwen2ForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from stare_lab.models.builtin import BUILTIN_DIR, build_tokenizer
    from stare_lab.signals import token_statistics
    from stare_lab.signals.generation import record_generation

    tok = build_tokenizer()
    model = Qwen2ForCausalLM.from_pretrained(BUILTIN_DIR).eval()
    ids = torch.tensor([tok("123+456=", add_special_tokens=False)["input_ids"]] * rows)
    gen_kw = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=tok.pad_token_id,
        temperature=1.0,
    )
    arms = {
        "plain": None,
        "logp+entropy": {"logp", "entropy"},
        "+p2, p2logp": {"logp", "entropy", "p2", "p2logp"},
        "attention entropy": {"attn_entropy"},
        "JS to the group mean (ict, groups of 8)": {"js"},
    }
    gen = {k: [] for k in arms}
    with torch.no_grad():
        seq = model.generate(**gen_kw)
        for _ in range(reps):
            for name, needs in arms.items():
                t0 = time.perf_counter()
                if needs is None:
                    model.generate(**gen_kw)
                else:
                    with record_generation(model, needs, js_group=8, eos_ids=(tok.eos_token_id,)):
                        model.generate(**gen_kw)
                gen[name].append(time.perf_counter() - t0)
    _print_min_table(
        f"transformers generation, {rows} rows × {new_tokens} new tokens, min of {reps}",
        "recorded",
        gen,
        baseline="plain",
    )
    P = ids.size(1)
    batch = {
        "prompt_ids": seq[:, :P],
        "prompt_mask": torch.ones_like(seq[:, :P]),
        "completion_ids": seq[:, P:],
        "completion_mask": torch.ones_like(seq[:, P:]),
    }
    copy_model = Qwen2ForCausalLM.from_pretrained(BUILTIN_DIR).eval()
    add_fused_lm_head(copy_model, temperature=1.0, outputs=("log_probs", "entropy"))
    ids_all, mask_all = seq, torch.ones_like(seq)
    labels = ids_all.masked_fill(mask_all == 0, -100)
    labels[:, :P] = -100
    fwd = {
        "TRL fused old-log-prob forward": lambda: copy_model(
            input_ids=ids_all, attention_mask=mask_all, labels=labels, fused_lm_head=True
        ),
        "ride: logp+entropy": lambda: token_statistics(model, batch, {"logp", "entropy"}, num_generations=8),
        "ride: + attention entropy": lambda: token_statistics(
            model, batch, {"logp", "entropy", "attn_entropy"}, num_generations=8
        ),
        "ride: JS (ict)": lambda: token_statistics(model, batch, {"js"}, num_generations=8),
    }
    times = {k: [] for k in fwd}
    with torch.no_grad():
        for _ in range(reps):
            for name, fn in fwd.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    _print_min_table(
        f"no-grad forward of the {rows} rollouts, min of {reps}",
        "forward",
        times,
        baseline="TRL fused old-log-prob forward",
    )


def _print_min_table(title: str, what: str, times: dict[str, list[float]], baseline: str) -> None:
    """A markdown table of each arm's minimum time and its ratio over the baseline arm's."""
    base = min(times[baseline])
    print(f"\n{title}:")
    print(f"| {what} | time (s) | ratio |\n|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {min(ts):.4f} | {min(ts) / base:.3f} |")


def memory(T: int, B: int) -> None:
    sdpa, ae, eager = (peak_memory(m, T, B) for m in ("sdpa", "ae", "eager"))
    extra_ae, extra_eager = max(ae - sdpa, 0), max(eager - sdpa, 0)
    print(
        f"\nattention entropy at T={T}, B={B} (built-in model, 4 layers × 4 heads): growth of peak RSS during one "
        f"no-grad forward, each in a fresh process"
    )
    print("| forward | peak growth (MB) | extra over plain sdpa (MB) |\n|---|---|---|")
    for name, v, extra in (
        ("plain sdpa", sdpa, 0),
        ("sdpa + chunked AE of 1 layer", ae, extra_ae),
        ("eager output_attentions", eager, extra_eager),
    ):
        print(f"| {name} | {v / 1024:.0f} | {extra / 1024:.0f} |")
    print(f"extra memory ratio AE / eager: {extra_ae / max(extra_eager, 1):.3f} (target ≤ 0.1)")


if __name__ == "__main__":
    main()
