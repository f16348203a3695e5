"""Where a rule's statistics cost goes on a GPU (a diagnostic beside gpu_check.py).

    python benchmarks/gpu_profile.py [--tiny] [--rule top_entropy]

1. One generation batch's statistics on a Qwen2.5-0.5B-shaped model (8 rows × 1024 completion tokens), each
   piece timed alone (CUDA synchronised, median of 5): TRL's own fused old-log-prob forward (log-probs and
   entropy, its Triton kernel on CUDA), our decoder forward, our chunked vocabulary statistics of its hidden
   states (bf16 logits, float32 reduction), and the whole `token_statistics` call.
2. torch.profiler over 4 training steps of plain TRL and of the rule with num_iterations = 2 (statistics riding
   on TRL's old-log-prob forward): the operators with the most self CUDA and self CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check  # noqa: E402  (puts the repository on sys.path)


def timed(fn, tiny: bool, reps: int = 5) -> float:
    fn()
    out = []
    for _ in range(reps):
        gpu_check._sync(tiny)
        t0 = time.perf_counter()
        fn()
        gpu_check._sync(tiny)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def pieces(model, tok, T: int, rows: int, tiny: bool) -> dict:
    import torch
    from trl.trainer.utils import add_fused_lm_head

    from stare_lab.signals import forward_with_stats
    from stare_lab.signals.statistics import token_statistics
    from stare_lab.signals.vocab import chunked_vocab_stats, lm_head_of

    dev = model.device
    P = 10
    ids = torch.randint(3, len(tok), (rows, P + T), device=dev)
    mask = torch.ones_like(ids)
    labels = ids.clone()
    labels[:, :P] = -100
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    batch = {
        "prompt_ids": ids[:, :P],
        "prompt_mask": mask[:, :P],
        "completion_ids": ids[:, P:],
        "completion_mask": mask[:, P:],
    }
    head, _ = lm_head_of(model)
    with torch.no_grad():
        hidden, _ = forward_with_stats(model, ids, mask)
        h = hidden[:, P - 1 : P + T - 1]
        out = {
            "trl_fused_logp_entropy": timed(
                lambda: model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True), tiny
            ),
            "our_decoder_forward": timed(lambda: forward_with_stats(model, ids, mask), tiny),
            "our_vocab_stats": timed(lambda: chunked_vocab_stats(h, head, ids[:, P:], want=("entropy",)), tiny),
            "our_token_statistics": timed(
                lambda: token_statistics(model, batch, {"logp", "entropy"}, num_generations=4), tiny
            ),
        }
    for k, v in out.items():
        print(f"{k}: {v * 1e3:.1f} ms", flush=True)
    return out


def profile(model, tok, rule, T: int, rows: int, tiny: bool) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([] if tiny else [ProfilerActivity.CUDA])
    with torch_profile(activities=acts) as prof:
        times = gpu_check.step_times(model, tok, rule, T, rows, 5, tiny, num_iterations=2)
    print(f"== {rule or 'plain TRL'}, num_iterations=2: steps {[round(t, 3) for t in times]}", flush=True)
    ka = prof.key_averages()
    if not tiny:
        print(ka.table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60), flush=True)
    print(ka.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=60), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--rule", default="top_entropy")
    a = p.parse_args()
    model, tok = gpu_check.build(a.tiny)
    T, rows = (16, 8) if a.tiny else (1024, 8)
    pieces(gpu_check.copy.deepcopy(model), tok, T, rows, a.tiny)
    for rule in (None, a.rule):
        profile(model, tok, rule, T, rows, a.tiny)


if __name__ == "__main__":
    main()
