"""launcher_plugin_example: a launcher defined outside stare_lab, to prove that a launcher is one file.

Importing this module registers `plugin_example`: runs on this machine, one submitit job per run,
at most `slots` at once. Its keys, their ranges and their defaults are its fields (it has no
conf/launcher YAML); nothing else in the project changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stare_lab.launchers import Launcher, register_launcher

NAME = "plugin_example"


@register_launcher(NAME)
@dataclass(frozen=True)
class PluginLauncher(Launcher):
    parallel_key = "slots"  # what --workers sets

    slots: int = field(default=1, metadata={"ge": 1})  # runs at once
    minutes: float = field(default=60.0, metadata={"ge": 1})  # wall-clock limit of one run

    def layout(self, runs: int) -> str:
        return f"processes per run: 1; {min(runs, self.slots)} runs at once ({self.slots} slots)"

    def executor(self, folder: Path, job_name: str):
        import submitit

        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=self.minutes)
        return ex

    def starter(self, executor, workers):
        from stare_lab.launchers.jobs import RunStarter

        return RunStarter(executor, workers.run, self.slots)

    def stop(self, jobs, echo) -> None:
        from stare_lab.launchers.jobs import stop_local

        stop_local(jobs, echo, wait_s=30.0)
