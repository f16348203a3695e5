"""Threads of a worker process, and how its idle threads wait (docs/performance.md, "Threads").

A worker's torch threads are decided by the first of:

1. `launcher.threads_per_worker` (the sweep's `launcher:` block; `stare-lab train` has none);
2. `OMP_NUM_THREADS` in the worker's environment (the user's own, inherited from the shell that
   ran `sweep run`, or exported in a Slurm launcher's `setup` lines);
3. the cores this process may use: its CPU affinity (`os.sched_getaffinity`, what `taskset`, a
   cgroup cpuset or Slurm's task binding leave it), at most `SLURM_CPUS_PER_TASK` inside a Slurm
   job, shared by the worker processes that run at once on them (the local launcher: `workers` ×
   `processes`; a Slurm task has its own cores), and no more than those other processes leave free
   when the run starts (`busy_elsewhere`: 0.25 s of /proc/stat) — at least one.

(3) is decided again at the start of every run a queue worker takes (`sweep run`'s local workers),
so a worker that started on idle cores takes one thread for a run that starts beside other jobs.
Torch's own default (one thread per core of the machine, whatever else runs) is what (3) replaces:
N local workers each taking every core oversubscribe them N times, and two threads on two cores
that two other jobs keep busy wait on each other at every parallel region (a 6-run sweep's steps took
6-8× their idle time; deciding as above, 2.0×: benchmarks/shared_node.py, docs/performance.md).

Idle OpenMP threads do not spin for long: a worker's environment holds `OMP_WAIT_POLICY=PASSIVE` and,
for GNU libgomp (torch's OpenMP on Linux), `GOMP_SPINCOUNT=30000` (about 0.3 ms of spinning before a
thread sleeps, against libgomp's default 300,000; PASSIVE alone is 0), unless the user's environment
sets either. With libgomp's default, a thread that finishes its share of a parallel region spins
~3 ms, taking the time slices the other threads of the region need on cores other jobs use; with no
spin at all, the many short regions of a small model's step each pay a wake-up (the built-in model's
step took 2.1× its spinning time on idle cores), where 0.3 ms of spinning keeps today's idle speed.
Both are read once, when the OpenMP runtime loads (with torch), so they are in the environment the
worker starts with (the launchers: `spawn_env`) and, for a process that has not loaded torch yet,
set in its own environment before it does (`apply_wait_policy`).

The decision is exported as `OMP_NUM_THREADS` for the run when the user set none (`run_threads`),
because accelerate sets torch's threads itself on a multi-process CPU run where that variable is
unset (its PartialState: the node's physical cores over its local processes): a rank alone on its
node took 2 threads where its Slurm task had one core. A queue worker's next run decides afresh.

Official code (TRL, accelerate) leaves both to torch's defaults and the user's environment.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

WAIT_POLICY = "OMP_WAIT_POLICY"
SPIN_COUNT = "GOMP_SPINCOUNT"  # GNU libgomp's own: spins before an idle thread sleeps
PASSIVE = "PASSIVE"
SHORT_SPIN = "30000"  # about 0.3 ms (libgomp counts ~100,000 spins per ms), a tenth of its default
# What a run records when neither was in its environment when OpenMP loaded.
UNSET_POLICY = "unset (OpenMP's default: spin, then sleep)"
# How long `busy_elsewhere` watches the cores.
PROBE_S = 0.25


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


def decide_threads(
    per_worker: int | None, environ: Mapping[str, str], cpus: int, sharing: int = 1, busy: float = 0.0
) -> ThreadChoice:
    """Threads of one worker process (see the module docstring for the order). `cpus`: the cores the
    process may use (`usable_cpus()`); `sharing`: the worker processes sharing them; `busy`: cores
    of them other processes kept busy just now (`busy_elsewhere()`)."""
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
    what += f" / {sharing} workers" if sharing > 1 else ""
    free = max(1, int(max(1, int(cpus)) - busy + 0.5))  # the usable cores others leave, rounded
    if free < threads:
        threads, what = free, what + f", {busy:.1f} busy with other processes"
    return ThreadChoice(threads, what)


def _cpu_times(cpus: set[int]) -> tuple[int, int] | None:
    """(busy, total) clock ticks of `cpus` since boot, from /proc/stat; None where it can not be read."""
    busy = total = 0
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            for line in stat:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
                    busy += sum(ticks) - ticks[3] - ticks[4]
                    total += sum(ticks)
    except (OSError, ValueError):
        return None
    return (busy, total) if total else None


def busy_elsewhere(window_s: float = PROBE_S) -> float:
    """Cores of this process's affinity that other processes kept busy over the next `window_s`
    seconds (their busy time less this process's own CPU time); 0.0 where /proc/stat is unreadable."""
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return 0.0
    before, own_before = _cpu_times(cpus), os.times()
    t0 = time.monotonic()
    time.sleep(window_s)
    after, own_after = _cpu_times(cpus), os.times()
    if before is None or after is None:
        return 0.0
    own = own_after.user + own_after.system - own_before.user - own_before.system
    return others_load(before, after, len(cpus), own, time.monotonic() - t0)


def others_load(before: tuple[int, int], after: tuple[int, int], cpus: int, own_s: float, wall_s: float) -> float:
    """Cores kept busy by other processes between two (busy, total) /proc/stat readings of `cpus` cores:
    the busy share of their time × cpus, less this process's own CPU seconds over the wall seconds."""
    if after[1] <= before[1] or wall_s <= 0:
        return 0.0
    share = (after[0] - before[0]) / (after[1] - before[1])
    return max(0.0, share * cpus - own_s / wall_s)


def _user_policy(environ: Mapping[str, str]) -> bool:
    return bool(environ.get(WAIT_POLICY) or environ.get(SPIN_COUNT))


def spawn_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a launcher adds to the environment its workers start with: OMP_WAIT_POLICY=PASSIVE and
    GOMP_SPINCOUNT=30000, unless `environ` (default: this process's) sets either."""
    environ = os.environ if environ is None else environ
    return {} if _user_policy(environ) else {WAIT_POLICY: PASSIVE, SPIN_COUNT: SHORT_SPIN}


def openmp_loaded() -> bool:
    """Whether an OpenMP runtime is loaded in this process already (it read its environment then).
    Linux: the process's mapped libraries; elsewhere: whether torch is imported."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any(lib in line for line in maps for lib in ("libgomp", "libiomp", "libomp"))
    except OSError:
        return "torch" in sys.modules


def policy_text(environ: Mapping[str, str]) -> str:
    """The wait policy in a record's words: `PASSIVE`, `PASSIVE, GOMP_SPINCOUNT=30000`, or UNSET_POLICY."""
    policy, spin = (environ.get(WAIT_POLICY) or "").strip().upper(), (environ.get(SPIN_COUNT) or "").strip()
    if not policy and not spin:
        return UNSET_POLICY
    return ", ".join(x for x in (policy, f"{SPIN_COUNT}={spin}" if spin else "") if x)


def apply_wait_policy(environ: MutableMapping[str, str] | None = None) -> str:
    """Set `spawn_env`'s policy in this process's environment when the user set none and OpenMP has
    not loaded yet; returns the policy OpenMP runs with (`policy_text`)."""
    environ = os.environ if environ is None else environ
    if not openmp_loaded():
        for key, value in spawn_env(environ).items():
            environ[key] = value
    return policy_text(environ)
