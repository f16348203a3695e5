"""The kernel sets a test or benchmark may ask torch for (stare_lab.core.utils.cpu_kernel_sets): only those
the CPU has, capped by an emulated narrower CPU; and torch agrees with the CPU's flags."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stare_lab.core import utils

AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma"})  # an AMD EPYC of the Zen 2 kind
AVX512 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}


@pytest.mark.parametrize(
    ("flags", "asked", "expected"),
    [
        (AVX2_ONLY, None, ("default", "avx2")),
        (AVX512, None, ("default", "avx2", "avx512")),
        (AVX512, "avx2", ("default", "avx2")),  # the AVX2-only CPU emulated on an AVX-512 one
        (AVX2_ONLY, "avx512", ("default", "avx2")),  # asked for more than the CPU has: what it has
        (AVX512 - {"avx512bw"}, None, ("default", "avx2")),  # AVX-512 F alone is not ATen's AVX-512
        (frozenset({"sse4_2"}), None, ("default",)),
    ],
)
def test_kernel_sets_are_those_the_cpu_has(monkeypatch, flags, asked, expected):
    monkeypatch.setattr(utils, "_cpu_flags", lambda: flags)
    if asked is None:
        monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    else:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", asked)
    assert utils.cpu_kernel_sets() == expected


def test_the_widest_set_here_is_the_one_torch_runs_unasked():
    """This machine's flags read as torch reads its CPU: the widest set is torch's own choice."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"
    env = {"PATH": "/usr/bin:/bin"}
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    flags_sets = [k for k, need in utils.KERNEL_SETS.items() if need <= (utils._cpu_flags() or frozenset())]
    assert ran.stdout.strip() == flags_sets[-1]


def test_kernel_env_caps_onednn_and_mkl_with_avx2():
    assert utils.kernel_env("avx2") == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    }
    assert utils.kernel_env("avx512") == {"ATEN_CPU_CAPABILITY": "avx512"}
    with pytest.raises(ValueError, match="unknown kernel set 'sse'"):
        utils.kernel_env("sse")
