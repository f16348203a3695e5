"""Small shared helpers: atomic writes, a config section as a plain dict, and the commands' argument parser."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf


def atomic_write(path: Path | str, write: Callable[[str], object]) -> None:
    """`write(tmp_path)` into a temp file in the same folder, then rename: readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path | str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    atomic_write(path, write)


def atomic_write_json(path: Path | str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def plain_dict(section: DictConfig | Any) -> dict[str, Any]:
    """A config section (a DictConfig, resolved, or any mapping) as a plain dict; TypeError naming the
    type for anything else (OmegaConf's `to_container` is typed for lists and scalars too)."""
    data = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else section
    if not isinstance(data, Mapping):
        raise TypeError(f"expected a mapping, got {type(data).__name__}")
    return {str(k): v for k, v in data.items()}


class CommandLineError(Exception):
    """A bad command line, as one line: `<prog>: <argparse's message>`; the command prints it after
    `stare-lab: error: ` and exits 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that refuses a bad command line by raising CommandLineError instead of printing its usage
    block and exiting: every stare-lab refusal is one line (`--help` still prints and exits 0). The
    parsers of `add_subparsers` are of the same class."""

    def error(self, message: str) -> NoReturn:
        raise CommandLineError(f"{self.prog}: {message}")


def start_forked(fn: Callable[..., Any], calls: list[tuple], processes: int) -> Callable[[], list[Any]]:
    """`fn(*args)` for each `args` of `calls`, started now in `processes` forked processes (Linux), so the
    caller can work meanwhile; the function returned waits for them and gives their answers in order.
    With `processes` < 1, or where fork is not available, nothing starts now: the function returned runs
    the calls here, one after the other."""
    if processes < 1 or "fork" not in multiprocessing.get_all_start_methods():
        return lambda: [fn(*args) for args in calls]
    sys.stdout.flush()  # a forked child would print what this process has buffered again
    sys.stderr.flush()
    pool = multiprocessing.get_context("fork").Pool(processes)
    pending = pool.starmap_async(fn, calls, chunksize=1)

    def wait() -> list[Any]:
        try:
            return pending.get()
        finally:
            pool.terminate()
            pool.join()

    return wait


# ATen's CPU kernel sets, narrowest first, with the CPU flags each needs: ATen's own test (cpuinfo's
# AVX2 + FMA; AVX-512 F, BW, VL, DQ). torch 2.13 runs the set ATEN_CPU_CAPABILITY asks for whatever the
# CPU has, and dies of SIGILL at the first vectorised op without it: ask only for what the CPU has.
KERNEL_SETS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "avx2": frozenset({"avx2", "fma"}),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"}),
}


def _cpu_flags() -> frozenset[str] | None:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((ln for ln in info.splitlines() if ln.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


def cpu_kernel_sets() -> tuple[str, ...]:
    """The kernel sets a process here may ask for, narrowest first: those whose flags the CPU has, capped
    by ATEN_CPU_CAPABILITY where it is set (a narrower CPU emulated, as CI's AVX2 check does). Without
    /proc/cpuinfo, torch's own answer in a child without the variable (its widest)."""
    flags = _cpu_flags()
    names = list(KERNEL_SETS)
    if flags is not None:
        have = [k for k, need in KERNEL_SETS.items() if need <= flags]
    else:
        import subprocess

        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        code = "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"
        widest = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip()
        have = names[: names.index(widest) + 1] if widest in names else ["default"]
    asked = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    return tuple(have[: have.index(asked) + 1] if asked in have else have)


def kernel_env(kernel_set: str) -> dict[str, str]:
    """The variables that make torch, oneDNN and MKL run one kernel set (the AVX2-only CPU emulated: all
    three capped; "default": ATen's scalar kernels, oneDNN and MKL left at the CPU's)."""
    if kernel_set not in KERNEL_SETS:
        raise ValueError(f"unknown kernel set {kernel_set!r}; known: {', '.join(KERNEL_SETS)}")
    env = {"ATEN_CPU_CAPABILITY": kernel_set}
    if kernel_set == "avx2":
        env.update(ONEDNN_MAX_CPU_ISA="AVX2", MKL_ENABLE_INSTRUCTIONS="AVX2")
    return env
