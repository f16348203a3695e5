"""Layer 2, where runs execute: what a `launcher:` block means; the local and Slurm launchers, their jobs.
May import layer 1 and config.

Launchers: where a sweep's runs become jobs. One file per launcher, one registry.

A launcher is a frozen dataclass parsed from the sweep's `launcher:` block (its values: the file's
block, then the command line's options, over `conf/launcher/<name>.yaml` or, for a launcher
without such a file, the dataclass's own defaults; its types and ranges: its fields). It is
registered by name with `@register_launcher("name")` (a dict and a decorator, like
stare_lab.methods.registry). Nothing outside this package knows a launcher's name: the sweep code
asks the launcher object for what differs between launchers:

- `executor(folder, job_name)`: the submitit executor its jobs go to;
- `starter(executor, workers)`: how queued runs become jobs (stare_lab.launchers.jobs: queue workers, one job
  per run, a Slurm array), and `watch()`: how the launch tells that a job has ended;
- `parallel_runs`, `processes_per_run`, `gpus_per_run`, `worker_threads()`: how many runs at
  once, and what one run uses;
- `layout(runs)`: the dry run's resources line; `stop(jobs, echo)`: what Ctrl-C does to its jobs
  (and how the runs resume); `study_file`: where an Optuna search keeps its study.

Adding a launcher is one file: a registered subclass of `Launcher` (base.py). One shipped with
stare_lab also has its import line below and its values in conf/launcher/<name>.yaml. The job
callables (stare_lab.sweep.worker) reach a launcher as the `workers` argument of `starter`: a
launcher file never imports the worker, so reading a sweep file never reaches the runner.
"""

# The launchers shipped with stare_lab (explicit imports: registration order is the listing order).
from stare_lab.launchers import local, slurm  # noqa: F401
from stare_lab.launchers.base import (
    DEFAULT,
    LAUNCHERS,
    Fail,
    Launcher,
    launcher_defaults,
    launcher_names,
    parse_launcher,
    register_launcher,
)

__all__ = [
    "DEFAULT",
    "LAUNCHERS",
    "Fail",
    "Launcher",
    "launcher_defaults",
    "launcher_names",
    "parse_launcher",
    "register_launcher",
]
