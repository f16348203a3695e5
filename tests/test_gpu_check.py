"""benchmarks/gpu_check.py runs end to end with tiny shapes on the CPU and prints its JSON summary last."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stare_lab.methods import list_methods

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_tiny_prints_a_complete_summary_last():
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--tiny"], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["device"] == "cpu" and set(summary["steps"]) == {"16", "32"}
    for arms in summary["steps"].values():
        assert set(arms) == {"plain TRL", *list_methods()}
        assert arms["plain TRL"]["ratio"] == 1.0
        assert all(a["step_s"] > 0 and a["ratio"] > 0 for a in arms.values())
    rec = summary["generation_recording"]
    assert rec["plain_s"] > 0 and rec["recorded_s"] > 0 and rec["new_tokens"] == 8
    ae = summary["attention_entropy"]
    assert ae["T"] == 64 and {"sdpa", "sdpa+ae", "eager_output_attentions"} <= set(ae)


def test_gpu_check_without_cuda_says_so_in_one_line():
    import torch

    if torch.cuda.is_available():
        return
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py")], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and run.stderr.strip() == "gpu_check: no CUDA device (use --tiny for the CPU smoke test)"
