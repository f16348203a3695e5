"""Launching a sweep's runs through submitit, safely re-runnable: the orchestration.

`launch_runs` writes each planned run's config.yaml and status.json (stare_lab.plan.run_plan), hands
the queue to the sweep's launcher (stare_lab.launchers: its executor, its starter, its
watch), and waits with a progress display until every run has ended, recording as failed any run
whose job ended without the worker recording it (killed, out of memory, node lost;
stare_lab.launchers.jobs.reconcile). A worker that finds the run claimed by another leaves it; the
launch then watches that run, and resumes it if its worker dies. The caller holds the sweep lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stare_lab.launchers.jobs import Tracked, Workers, reconcile, record_stopped
from stare_lab.plan.run_plan import Plan, prepare
from stare_lab.plan.schema import SweepSpec
from stare_lab.sweep.progress import Progress
from stare_lab.sweep.worker import QueueWorker, RunWorker

POLL_S = 1.0


def make_executor(spec: SweepSpec):
    """The submitit executor of the sweep's launcher, its logs under <sweep folder>/submitit/."""
    return spec.launcher.executor(spec.folder / "submitit" / "%j", f"stare_lab:{spec.name}")


def launch_runs(spec: SweepSpec, plan: Plan, echo: Callable[[str], None] = print) -> dict[str, int]:
    """Start the plan's runs, watch them and the active ones until all end; returns counts by state."""
    launcher = spec.launcher
    threads = launcher.worker_threads()
    starter = launcher.starter(make_executor(spec), Workers(run=RunWorker(threads), queue=QueueWorker(threads)))
    for run, kind in plan.start:
        prepare(run, fresh=kind == "rerun")
    queue = [run for run, _ in plan.start]
    waiting = [Tracked(run) for run in plan.active]
    waiting += starter.begin(queue)
    counts = {"finished": len(plan.finished), "failed": 0, "interrupted": 0}
    watch = launcher.watch()
    with Progress(len(queue) + len(waiting), echo) as advance:
        try:
            while queue or waiting:
                starter.start(queue, waiting)
                for t in watch.ended_runs(waiting):
                    waiting.remove(t)
                    state = reconcile(t)
                    if state == "watch":  # another worker holds the run: follow it instead
                        waiting.append(Tracked(t.run))
                    elif state == "resume":  # its earlier worker died while we watched
                        prepare(t.run)
                        queue.append(t.run)
                    else:
                        counts[state] = counts.get(state, 0) + 1
                        advance(t.run, state)
                time.sleep(POLL_S if (queue or waiting) else 0)
        except KeyboardInterrupt:
            launcher.stop([t.job for t in waiting if t.job is not None] + starter.live_jobs(), echo)
            record_stopped(waiting)
            raise
    return counts
