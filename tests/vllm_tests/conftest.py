"""The vLLM tests run in the `vllm` extra's own environment (.venv-vllm, `make vllm-env`):
`make test` runs them there with .venv-vllm/bin/python. In an environment without vLLM (the main
.venv) this folder is not collected; tests/run/test_vllm_env.py says there whether the vllm env exists
(a skip naming `make vllm-env`, a failure under CI=1).

One engine for the whole session: `vllm_engine.reuse_engines()` hands every trainer the engine the
first one built (~30-60 s per start on CPU). That is sound because TRL pushes the policy's weights
into the engine before every generation, and tests/vllm_tests/test_colocate.py checks that it does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stare_lab.config.schema import missing_vllm

if missing_vllm():
    collect_ignore_glob = ["test_*.py"]


HERE = Path(__file__).resolve().parent


# What vLLM's CPU backend runs when an engine starts, found one by one under a PATH of the venv and the
# basic tools: `lscpu` (util-linux, its CPU topology), a C++ compiler (torch inductor compiles the model;
# torch looks for g++) and `openssl` (inductor's cache keys).
CPU_ENGINE_TOOLS = ("lscpu", "g++", "openssl")


def pytest_collection_modifyitems(config, items):
    """Where a tool the CPU engine runs is not on PATH (a PATH of the venv and a few tools), these tests skip
    naming it rather than fail."""
    import torch

    missing = [t for t in CPU_ENGINE_TOOLS if shutil.which(t) is None]
    if not missing or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"vLLM's CPU backend needs {', '.join(missing)}, not on PATH")
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def shared_engine():
    from stare_lab.training import vllm_engine

    vllm_engine.reuse_engines()
    yield
    vllm_engine.reuse_engines(False)
