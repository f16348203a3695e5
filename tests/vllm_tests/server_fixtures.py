"""A training task's stand-in for the Slurm server tests (tests/vllm_tests/test_server_slurm.py).

On CPU the real trainer cannot train against the server (TRL's weight sync is NCCL on CUDA), so the job's
training task runs `client_execute` instead of stare_lab.run.runner.execute: the same server set-up as the
runner (`vllm_server.for_run`: the server task's address, the /health watch between steps), one request of
TRL's own `VLLMClient` (health check, then generate), then stand-in steps with the runner's checkpoint,
resume and metrics contract (sweep_fixtures.standin_execute), each after the watch's check. Picklable by
reference: the jobs import this module (the tests put tests/vllm_tests on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

CLIENT_FILE = "client.jsonl"  # one line per attempt: what the training task saw of the server


def client_execute(run_dir: Path | str, step_s: float = 1.0) -> None:
    from trl.generation.vllm_client import VLLMClient

    from stare_lab.config.run_config import load_config
    from stare_lab.serving.vllm_server import for_run

    run_dir = Path(run_dir)
    cfg = load_config(run_dir / "config.yaml")
    with for_run(cfg, run_dir) as watch:
        t = cfg.trainer
        url = f"http://{t.vllm_server_host}:{t.vllm_server_port}"
        client = VLLMClient(base_url=url, connection_timeout=30)  # GET /health until it answers
        out = client.generate(["12+7="], n=2, max_tokens=4, temperature=1.0)
        seen = {
            "url": url,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "rank": int(os.environ.get("RANK", "0")),
            "completion_ids": out["completion_ids"],
            "time": time.time(),
        }
        with (run_dir / CLIENT_FILE).open("a") as f:
            f.write(json.dumps(seen) + "\n")
        _steps(run_dir, cfg, watch, step_s)


def _steps(run_dir: Path, cfg, watch: list, step_s: float) -> None:
    """sweep_fixtures.standin_execute's steps (checkpoints every save_steps, metrics after the last one
    dropped on resume), each preceded by the server watch's check, as the trainer's on_step_begin."""
    t = cfg.trainer
    done = [
        int(p.name.split("-")[1])
        for p in (run_dir / "checkpoints").glob("checkpoint-*")
        if (p / "trainer_state.json").is_file()
    ]
    last = max(done, default=0)
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= last))
    for step in range(last + 1, int(t.max_steps) + 1):
        for callback in watch:
            callback.on_step_begin(None, SimpleNamespace(global_step=step - 1), None)
        time.sleep(step_s)
        with metrics.open("a") as f:
            f.write(json.dumps({"step": step, "time": time.time(), "reward": 0.5}) + "\n")
        if step % int(t.save_steps) == 0 or step == int(t.max_steps):
            d = run_dir / "checkpoints" / f"checkpoint-{step}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
