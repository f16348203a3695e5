"""benchmarks/gpu_check.py runs end to end with tiny shapes on the CPU and prints its JSON summary last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stare_lab.methods import list_methods

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_tiny_prints_a_complete_summary_last():
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--tiny"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["device"] == "cpu" and set(summary["steps"]) == {"16", "32"}
    for arms in summary["steps"].values():
        assert set(arms) == {"plain TRL", *list_methods()}
        assert arms["plain TRL"]["ratio"] == 1.0
        assert all(a["step_s"] > 0 and a["ratio"] > 0 for a in arms.values())
    rules = list_methods()
    assert set(summary["num_iterations_2@16"]) == {"plain TRL", *rules}
    assert {"plain TRL", "stare", "top_entropy"} <= set(summary["scope_microbatch@16"]) < {"plain TRL", *rules}
    assert set(summary["generation@8"]) == {"plain TRL", "top_entropy", "stare", "anchor", "ict"}
    assert "skipped" not in summary
    rec = summary["generation_recording"]
    assert rec["plain_s"] > 0 and rec["recorded_s"] > 0 and rec["new_tokens"] == 8
    ae = summary["attention_entropy"]
    assert ae["T"] == 64 and {"sdpa", "sdpa+ae", "eager_output_attentions"} <= set(ae)


def test_gpu_check_without_cuda_says_so_in_one_line():
    import torch

    if torch.cuda.is_available():
        return
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0 and run.stderr.strip() == "gpu_check: no CUDA device (use --tiny for the CPU smoke test)"


def test_gpu_check_budget_skips_step_arms_but_keeps_the_required_measurements(tmp_path):
    """--budget-s 0: every step arm is named as skipped; the AE and recording measurements and the JSON file stay."""
    out = tmp_path / "summary.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_check.py"),
            "--tiny",
            "--budget-s",
            "0",
            "--rules",
            "stare",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == summary
    assert (
        summary["steps"] == {"16": {}, "32": {}}
        and "attention_entropy" in summary
        and "generation_recording" in summary
    )
    assert "16: stare" in summary["skipped"] and "generation@8: plain TRL" in summary["skipped"]


def test_gpu_profile_tiny_times_each_piece_and_profiles_both_arms():
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_profile.py"), "--tiny", "--rule", "anchor"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    for piece in ("trl_fused_logp_entropy", "our_decoder_forward", "our_vocab_stats", "our_token_statistics"):
        ms = [float(line.split(": ")[1].split()[0]) for line in lines if line.startswith(piece + ":")]
        assert len(ms) == 1 and ms[0] > 0, piece
    heads = [line for line in lines if line.startswith("== ")]
    assert [h.split(",")[0] for h in heads] == ["== plain TRL", "== anchor"]
