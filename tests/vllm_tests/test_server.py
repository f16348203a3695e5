"""Server mode on CPU, as far as the CPU allows (training against the server needs NCCL on CUDA):
the run's server starts, listens only on loopback on its per-run port, answers its health check and a
generate request from TRL's own VLLMClient, and is gone after the run; a server that never answers
fails the run after the timeout with one line and a true record."""

from __future__ import annotations

import json

import pytest

from stare_lab.cli import main
from stare_lab.config.run_config import compose
from stare_lab.serving import vllm_server

pytestmark = pytest.mark.vllm


def test_the_runs_server_listens_on_loopback_only_and_serves_trls_client(tmp_path):
    from trl.generation.vllm_client import VLLMClient

    cfg = compose(["trainer.use_vllm=true", "trainer.vllm_mode=server", "trainer.vllm_gpu_memory_utilization=0.1"])
    assert cfg.trainer.vllm_server_port is None  # chosen per run
    with vllm_server.serving(cfg, tmp_path) as server:
        port = cfg.trainer.vllm_server_port
        assert port == server.port and cfg.trainer.vllm_server_host == "127.0.0.1"
        sockets = vllm_server.listening(server.process.pid)
        assert ("127.0.0.1", port) in sockets, sockets
        assert all(ip == "127.0.0.1" for ip, _ in sockets), sockets  # nothing on 0.0.0.0 or another address
        client = VLLMClient(base_url=server.url, connection_timeout=30)
        out = client.generate(["12+7="], n=2, max_tokens=4, temperature=1.0)
        assert len(out["completion_ids"]) == 2 and all(1 <= len(c) <= 4 for c in out["completion_ids"]), out
        assert len(out["logprobs"]) == 2
    assert server.process.poll() is not None  # stopped with its process group
    assert vllm_server.free_port() and not _answers(server.url)


def _answers(url: str) -> bool:
    import requests

    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_an_unreachable_server_fails_the_run_after_its_timeout(tmp_path, capsys):
    port = vllm_server.free_port()  # nothing listens there
    args = [
        "train",
        "trainer.use_vllm=true",
        "trainer.vllm_mode=server",
        f"trainer.vllm_server_port={port}",
        "trainer.vllm_server_timeout=3",
        "logger=none",
        "eval.enabled=false",
        f"run_dir={tmp_path / 'run'}",
    ]
    assert main(args) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("stare-lab:")]
    assert len(err) == 1 and "run failed" in err[0] and f"127.0.0.1:{port}" in err[0] and "3" in err[0], err
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "failed", status
    assert not (tmp_path / "run" / "final").exists()
