"""What global statistics cost per step with 2 processes (gloo, CPU), for every rule.

Run: .venv/bin/python benchmarks/distributed_stats.py [--reps 20] [--rows 32] [--G 8] [--T 24]

Two processes (torch.multiprocessing, gloo, one torch thread each) hold the built-in model and a
generation batch shaped like conf/trainer/cpu_small.yaml (per rank: 16 rows × 2 micro-batches =
32 rows, G = 8, completions of up to 24 tokens). For every registered rule (default parameters)
each rank builds the TokenStats the statistics pass would give it (the rule's declared
statistics only, as `signals.token_statistics` returns them; logp NaN when undeclared, old_logp
the same tensor as logp on-policy) and measures:

- bytes: what this rank puts on the wire per step (shape exchange + packed statistics) and
  what it receives (the other rank's share);
- gather: wall time of `global_token_stats` (median over reps, max over the two ranks);
- rule+: the rule on the global batch minus the rule on this rank's rows (every rank now runs
  the rule on all rows);
- step: a measured tiny GRPO step of the built-in model on this rank's rows, the same on every
  line: sampling 24 tokens for 32 rows, one no-grad statistics forward (logits → entropy), two
  micro-batches of forward + backward under DDP (gradient all-reduce), one AdamW step. This is a
  stand-in for TokenRuleGRPOTrainer's step (the trainer is not wired for several processes yet),
  without TRL's reward and logging overhead, so the fractions are upper bounds.

The fraction printed is (gather + rule+) / step. ICT is also measured with a layout where groups
are split over ranks (B_local = 28, G = 8), where hidden states of the split groups travel too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def _timed(fn, reps: int) -> tuple[float, object]:
    """Median wall seconds of fn() over reps, aligned by a barrier; the max over ranks."""
    times, out = [], None
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t), out


def _local_stats(rule, trainer_values, rows: int, T: int, G: int, rank: int, seed: int):
    """The TokenStats the statistics pass would hand this rank for `rule` (random values)."""
    from stare_lab.stats import TokenStats

    g = torch.Generator().manual_seed(seed + rank)
    lengths = torch.randint(4, T + 1, (rows,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    group = (rank * rows + torch.arange(rows)) // G
    needs = set(rule.needs_for(trainer_values) if hasattr(rule, "needs_for") else rule.needs)
    if "p2" in needs:
        needs.add("p2logp")
    # as the statistics pass builds it: declared statistics only, logp NaN when not declared
    logp = -torch.rand(rows, T, generator=g) * 5 if "logp" in needs else torch.full((rows, T), float("nan"))
    fields = dict(logp=logp, mask=mask, advantages=torch.randn(rows, generator=g), group=group)
    for name in ("entropy", "attn_entropy", "js", "p2", "p2logp", "ref_logp"):
        if name in needs:
            fields[name] = torch.rand(rows, T, generator=g)
    if "old_logp" in needs:
        fields["old_logp"] = logp  # on-policy: TRL computed no old log-probs, π_old is the rollout policy
    return TokenStats(**fields)


def _tiny_step(model, opt, prompt, T, micro_batches: int):
    """Sample, one statistics forward, micro-batch forward/backward (DDP), an optimizer step."""
    inner = model.module
    with torch.no_grad():
        out = inner.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=True,
            max_new_tokens=T,
            min_new_tokens=T,
            pad_token_id=0,
        )
        logits = inner(out).logits[:, prompt.size(1) - 1 : -1].float()
        logp = torch.log_softmax(logits, -1)
        _ = -(logp.exp() * logp).sum(-1)
    opt.zero_grad()
    for mb in out.chunk(micro_batches):
        lp = torch.log_softmax(model(mb).logits[:, prompt.size(1) - 1 : -1].float(), -1)
        lp.gather(-1, mb[:, prompt.size(1) :].unsqueeze(-1)).mean().backward()
    opt.step()


def _worker(rank: int, world: int, init_file: str, args, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import Qwen2ForCausalLM

    from stare_lab.methods import RuleState, get_method, list_methods
    from stare_lab.models.builtin import BUILTIN_DIR
    from stare_lab.signals.distributed import global_token_stats, payload_bytes, split_rows
    from stare_lab.signals.statistics import js_for_split_groups

    torch.manual_seed(0)
    model = DDP(Qwen2ForCausalLM.from_pretrained(BUILTIN_DIR))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    prompt = torch.randint(3, model.module.config.vocab_size, (args.rows, 12))
    step_s, _ = _timed(lambda: _tiny_step(model, opt, prompt, args.T, 2), max(3, args.reps // 4))

    state = RuleState(step=20, total_steps=100, seed=0)
    try:
        from stare_lab.methods import TrainerValues

        state.trainer = TrainerValues(
            epsilon_low=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo", num_generations=args.G
        )
    except ImportError:
        pass
    lines = []
    for name in list_methods():
        rule = get_method(name)
        local = _local_stats(rule, getattr(state, "trainer", None), args.rows, args.T, args.G, rank, seed=1)
        gather_s, (gstats, _) = _timed(lambda: global_token_stats(local), args.reps)
        rule_global_s, _ = _timed(lambda: rule(gstats, state), args.reps)
        rule_local_s, _ = _timed(lambda: rule(local, state), args.reps)
        sent = payload_bytes(local)
        lines.append((name, sent, sent * (world - 1), gather_s, rule_global_s - rule_local_s, rule_local_s))

    # ICT with groups split over ranks: the split groups' hidden states travel, P̄ is recomputed
    rows = args.rows - 4
    group = (rank * rows + torch.arange(rows)) // args.G
    split = split_rows(group, args.G)
    hidden_size = model.module.config.hidden_size
    h = torch.randn(int(split.sum()), args.T, hidden_size)
    live = torch.ones(int(split.sum()), args.T)
    head = model.module.get_output_embeddings()
    js_s, _ = _timed(lambda: js_for_split_groups(h, live, group[split], head, chunk_positions=64), args.reps)
    split_bytes = h.numel() * h.element_size() + live.numel() * live.element_size()
    if rank == 0:
        torch.save(
            {
                "step_s": step_s,
                "lines": lines,
                "js": (int(split.sum()), split_bytes, js_s),
                "vocab": model.module.config.vocab_size,
                "hidden": hidden_size,
            },
            out_file,
        )
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=32, help="rows per rank (per-device batch × steps_per_generation)")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--T", type=int, default=24)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.pt"
        mp.start_processes(
            _worker, args=(2, str(Path(tmp) / "store"), args, str(out)), nprocs=2, join=True, start_method="spawn"
        )
        r = torch.load(out, weights_only=False)
    step = r["step_s"]
    print(
        f"2 processes, gloo on CPU, per rank {args.rows} rows × T={args.T}, G={args.G}; "
        f"tiny step (see docstring) {step * 1e3:.1f} ms"
    )
    print(
        f"{'rule':<12} {'sent/rank':>10} {'recv/rank':>10} {'gather ms':>10} {'rule+ ms':>9} "
        f"{'rule ms':>8} {'of step':>8}"
    )
    for name, sent, recv, gather_s, extra_s, rule_s in r["lines"]:
        frac = (gather_s + max(extra_s, 0.0)) / step
        print(
            f"{name:<12} {sent / 1024:>8.1f}Ki {recv / 1024:>8.1f}Ki {gather_s * 1e3:>10.2f} "
            f"{extra_s * 1e3:>9.2f} {rule_s * 1e3:>8.2f} {frac:>8.2%}"
        )
    n, nbytes, js_s = r["js"]
    print(
        f"ict, groups split over ranks (B_local={args.rows - 4}): {n} split rows/rank, "
        f"{nbytes / 1024:.1f} KiB hidden states sent/rank (H={r['hidden']}, V={r['vocab']}), "
        f"exchange + JS of the split groups {js_s * 1e3:.2f} ms = {js_s / step:.2%} of the step"
    )


if __name__ == "__main__":
    main()
