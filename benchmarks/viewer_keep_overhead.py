"""Cost of keeping a generation batch (trainer.keep_batches_every), as a ratio to the step without it.

Run: .venv/bin/python benchmarks/viewer_keep_overhead.py [--method full] [--steps 6] [--repeats 5]

The demo's trainer settings (conf/trainer/cpu_small.yaml, built-in model) train `--steps` steps; the
median optimizer step time (first step dropped) is the baseline. The hook
`stare_lab.viewer.collect_for_trainer` (the extra statistics every rule reads + writing the file) is
then timed on the last generation batch. Keeping every N steps costs (step + hook / N) / step; the
table prints it for a few N. `full` is the worst case: its own stats pass computes nothing, so the
hook computes everything (entropy, JS, attention entropy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from transformers import TrainerCallback  # noqa: E402


class StepClock(TrainerCallback):
    def __init__(self):
        self.times: list[float] = []
        self._t = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._t)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default="full")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from stare_lab.config.run_config import compose
    from stare_lab.run.runner import build_trainer
    from stare_lab.viewer import collect_for_trainer

    cfg = compose(
        [
            f"method={args.method}",
            f"trainer.max_steps={args.steps}",
            "trainer.save_steps=1000",
            "logger=none",
            "eval.enabled=false",
        ]
    )
    with tempfile.TemporaryDirectory() as tmp:
        clock = StepClock()
        trainer = build_trainer(cfg, Path(tmp), callbacks=[clock])
        captured: dict = {}
        generate = trainer._generate_and_score_completions

        def keep_last(inputs):
            captured["state"] = trainer.rule_state.to_dict()
            captured["out"] = out = generate(inputs)
            return out

        trainer._generate_and_score_completions = keep_last
        trainer.train()
        step = statistics.median(clock.times[1:])
        out = captured["out"]
        costs, path = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            path = collect_for_trainer(
                trainer,
                out,
                None,
                run_dir=tmp,
                every=1,
                rule_state=captured["state"],
                trained_weights=out["token_weights"],
            )
            costs.append(time.perf_counter() - t0)
        hook = statistics.median(costs)
        B, T = out["completion_ids"].shape
        print(
            f"demo trainer settings, method={args.method}, {args.threads} torch thread(s); generation batch {B} × {T}"
        )
        print(f"median step {step:.3f} s; keeping one batch {hook:.3f} s (file {path.stat().st_size / 1e3:.0f} kB)")
        print("keep_batches_every   step time ratio")
        for n in (1, 5, 10, 20):
            print(f"{n:>19}   {(step + hook / n) / step:.4f}")
        need = hook / (0.01 * step)
        print(f"≤ 1% needs keep_batches_every ≥ {int(need) + 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
