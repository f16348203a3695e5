"""Threads of a worker process, and how its idle threads wait (docs/performance.md, "Threads").

A worker's torch threads are decided when the process starts (`start_worker`), by the first of:

1. `launcher.threads_per_worker` (the sweep's `launcher:` block; `stare-lab train` has none);
2. `OMP_NUM_THREADS` in the worker's environment (the user's own, inherited from the shell that
   ran `sweep run`, or exported in a Slurm launcher's `setup` lines);
3. the cores this process may use: its CPU affinity (`os.sched_getaffinity`, what `taskset`, a
   cgroup cpuset or Slurm's task binding leave it), at most `SLURM_CPUS_PER_TASK` inside a Slurm job,
   shared by the worker processes that run at once on them (the local launcher: `workers` ×
   `processes`; a Slurm task has its own cores) — at least one each.

Torch's own default (one thread per core of the machine, whatever else runs) is what (3) replaces:
N local workers each taking every core oversubscribe them N times.

Idle OpenMP threads sleep: a worker's environment holds `OMP_WAIT_POLICY=PASSIVE` unless the user's
sets one. With the OpenMP default, a thread that finishes its share of a parallel region spins for
a while before it sleeps (GNU libgomp: 300,000 spins); on cores other jobs use, those spins take the
time slices the other threads of the same region need, and a step takes 5-15× longer
(benchmarks/shared_node.py). The policy is read once, when the OpenMP runtime loads (with torch), so
it is set in the environment the worker starts with (the launchers: `spawn_env`) and, for a process
that has not loaded torch yet, in its own environment before it does (`apply_wait_policy`).

Official code (TRL, accelerate) leaves both to torch's defaults and the user's environment.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

WAIT_POLICY = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"
# What a run records when OMP_WAIT_POLICY was not in its environment when OpenMP loaded.
UNSET_POLICY = "unset (OpenMP's default: spin, then sleep)"


@dataclass(frozen=True)
class WorkerThreads:
    """What a launcher tells its worker processes about threads (picklable; no torch).

    `per_worker`: the `threads_per_worker` key (None: decide from the environment); `sharing`: the
    worker processes that run at once on the cores this one may use (1: a job with cores of its own)."""

    per_worker: int | None = None
    sharing: int = 1


@dataclass(frozen=True)
class ThreadChoice:
    """The decision: `threads` and, in words, what decided it (`source`)."""

    threads: int
    source: str


def usable_cpus() -> int:
    """The cores this process may run on (its affinity), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _positive_int(text: str | None) -> int | None:
    """A positive integer, or None (unset, empty, not a number, ≤ 0)."""
    try:
        value = int(str(text).strip())
    except (TypeError, ValueError):
        return None
    return value if value >= 1 else None


def omp_num_threads(environ: Mapping[str, str]) -> int | None:
    """OMP_NUM_THREADS as the OpenMP runtime reads it: the first level of a list ("4,2" → 4); None when
    unset or not a positive integer (the runtime ignores such a value too)."""
    value = environ.get("OMP_NUM_THREADS")
    return _positive_int(value.split(",")[0]) if value else None


def decide_threads(per_worker: int | None, environ: Mapping[str, str], cpus: int, sharing: int = 1) -> ThreadChoice:
    """Threads of one worker process (see the module docstring for the order). `cpus`: the cores the
    process may use (`usable_cpus()`); `sharing`: the worker processes sharing them."""
    if per_worker is not None:
        return ThreadChoice(int(per_worker), "launcher.threads_per_worker")
    omp = omp_num_threads(environ)
    if omp is not None:
        return ThreadChoice(omp, "OMP_NUM_THREADS")
    cores, what = max(1, int(cpus)), f"{max(1, int(cpus))} usable cores"
    slurm = _positive_int(environ.get("SLURM_CPUS_PER_TASK"))
    if slurm is not None and slurm < cores:
        cores, what = slurm, f"SLURM_CPUS_PER_TASK={slurm}"
    sharing = max(1, int(sharing))
    threads = max(1, cores // sharing)
    return ThreadChoice(threads, what + (f" / {sharing} workers" if sharing > 1 else ""))


def spawn_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a launcher adds to the environment its workers start with: OMP_WAIT_POLICY=PASSIVE unless
    `environ` (default: this process's) names a policy already."""
    environ = os.environ if environ is None else environ
    return {} if environ.get(WAIT_POLICY) else {WAIT_POLICY: PASSIVE}


def openmp_loaded() -> bool:
    """Whether an OpenMP runtime is loaded in this process already (it read its environment then).
    Linux: the process's mapped libraries; elsewhere: whether torch is imported."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any(lib in line for line in maps for lib in ("libgomp", "libiomp", "libomp"))
    except OSError:
        module = sys.modules.get("torch")
        return module is not None and "_real" not in vars(module)  # stare_lab.deferred's stand-in is not torch


def apply_wait_policy(environ: MutableMapping[str, str] | None = None) -> str:
    """Set OMP_WAIT_POLICY=PASSIVE in this process's environment when no policy is set and OpenMP has
    not loaded yet; returns the policy OpenMP runs with (UNSET_POLICY: none was set when it loaded)."""
    environ = os.environ if environ is None else environ
    if not environ.get(WAIT_POLICY) and not openmp_loaded():
        environ[WAIT_POLICY] = PASSIVE
    policy = environ.get(WAIT_POLICY)
    return policy.strip().upper() if policy else UNSET_POLICY
