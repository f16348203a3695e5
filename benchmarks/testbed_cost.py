"""The testbed's cost per optimizer step and per evaluation, next to the previous built-in model's, in one run.

    python benchmarks/testbed_cost.py [--old-commit 86128eb] [--steps 10] [--repeats 2]

The previous model (the one before the two-procedure testbed) is read from git at `--old-commit` into a
temporary folder; both models then train `full` with cpu_small's settings for `--steps` steps and evaluate
the demo's 48 problems × 32 samples, alternately, `--repeats` times each, on the current task. Per-step
time is read from metrics.jsonl (the span of the logged steps over their number, so start-up does not
count), the evaluation's from the record (its end minus the last step's log). Prints medians, the ratio
new / old, and each model's mean completion length (what generation costs depend on). docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def old_model(commit: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        blob = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:stare_lab/models/builtin/{name}"],
            capture_output=True,
            check=True,
        ).stdout
        (into / name).write_bytes(blob)
    return into


def one_run(model: str, steps: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "stare_lab.cli", "train", f"model.name_or_path={model}", "method=full",
           f"trainer.max_steps={steps}", f"trainer.save_steps={steps}", "task.heldout_size=48", "eval.n=32",
           "eval.batch_size=768", "logger=none"]  # fmt: skip
    subprocess.run(cmd, cwd=out, check=True, capture_output=True, env={**os.environ, "TQDM_DISABLE": "1"})
    [run] = [p.parent for p in out.glob("runs/train/*/config.yaml")]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    status = json.loads((run / "status.json").read_text())
    finished = datetime.fromisoformat(status["finished"]).timestamp()
    step_s = (rows[-1]["time"] - rows[0]["time"]) / (rows[-1]["step"] - rows[0]["step"])
    length = statistics.mean(r["completions/mean_length"] for r in rows if "completions/mean_length" in r)
    return {"step_s": step_s, "eval_s": finished - rows[-1]["time"], "length": length}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old-commit", default="86128eb")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = {"old": str(old_model(a.old_commit, Path(tmp) / "old")), "testbed": "builtin"}
        results: dict[str, list[dict]] = {k: [] for k in models}
        for i in range(a.repeats):
            for name, model in models.items():  # alternately: both see the same load
                out = Path(tmp) / f"{name}-{i}"
                out.mkdir()
                results[name].append(one_run(model, a.steps, out))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {a.steps} steps of "
          f"full with cpu_small's settings; evaluation: 48 problems x 32 samples; medians of {a.repeats}")  # fmt: skip
    print("| model | s / step | evaluation s | completion length (tokens) |\n|:--|--:|--:|--:|")
    med = {
        k: {m: statistics.median(r[m] for r in v) for m in ("step_s", "eval_s", "length")} for k, v in results.items()
    }
    for name, m in med.items():
        print(f"| {name} | {m['step_s']:.3f} | {m['eval_s']:.2f} | {m['length']:.1f} |")
    print(f"ratio testbed / old: step {med['testbed']['step_s'] / med['old']['step_s']:.2f}, "
          f"evaluation {med['testbed']['eval_s'] / med['old']['eval_s']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
