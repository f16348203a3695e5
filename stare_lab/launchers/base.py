"""The launcher interface and its registry (a dict and a decorator); see the package docstring."""

from __future__ import annotations

import abc
import dataclasses
import functools
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from stare_lab.config.run_config import CONF_DIR, field_problem
from stare_lab.launchers.jobs import JobWatch
from stare_lab.launchers.threads import WorkerThreads

if TYPE_CHECKING:
    from stare_lab.launchers.jobs import Starter, Workers

DEFAULT = "local"  # the launcher of a sweep without a `launcher:` block
LAUNCHERS: dict[str, type[Launcher]] = {}
Fail = Callable[[str, str], None]  # (key path, message) -> raises SweepError


def register_launcher(name: str) -> Callable[[type[Launcher]], type[Launcher]]:
    """Class decorator: make `name` in a sweep's `launcher:` block (and `--launcher`) this class."""

    def add(cls: type[Launcher]) -> type[Launcher]:
        if name in LAUNCHERS:
            raise ValueError(f"launcher {name!r} is already registered ({LAUNCHERS[name].__qualname__})")
        cls.name = name
        LAUNCHERS[name] = cls
        return cls

    return add


def launcher_names() -> tuple[str, ...]:
    return tuple(LAUNCHERS)


def launcher_defaults(name: str) -> dict[str, Any]:
    """Every key of a launcher with its default value: conf/launcher/<name>.yaml, else the
    dataclass's field defaults (a launcher registered from outside stare_lab)."""
    path = CONF_DIR / "launcher" / f"{name}.yaml"
    if path.is_file():
        return {**(yaml.safe_load(path.read_text()) or {}), "name": name}
    return {
        "name": name,
        **{f.name: f.default for f in dataclasses.fields(LAUNCHERS[name]) if f.default is not dataclasses.MISSING},
    }


def parse_launcher(block: Any, cli: Mapping[str, Any], fail: Fail) -> Launcher:
    """The sweep's `launcher:` block (None, a name, or a mapping) with the command line's options
    (`cli`; its `name` switches the launcher, keeping only the keys the new one knows)."""
    block = {"name": DEFAULT} if block is None else block
    if isinstance(block, str):
        block = {"name": block}
    if not isinstance(block, dict):
        fail("launcher", f"expected a mapping with `name: {'|'.join(LAUNCHERS)}`, got {block!r}")
    name = cli.get("name") or block.get("name", DEFAULT)
    if name not in LAUNCHERS:
        fail("launcher.name", f"unknown launcher {name!r}; valid: {', '.join(LAUNCHERS)}")
    cls = LAUNCHERS[name]
    fields = _fields(cls)
    values = {k: v for k, v in launcher_defaults(name).items() if k != "name"}
    given = {k: v for k, v in block.items() if k != "name"}
    if block.get("name", DEFAULT) != name:  # --launcher switched it: keep only keys the new one knows
        given = {k: v for k, v in given.items() if k in fields}
    given.update({k: v for k, v in cli.items() if k != "name" and v is not None})
    for k, v in given.items():
        if k not in fields:
            fail(f"launcher.{k}", f"unknown key for the {name} launcher; valid keys: {', '.join(sorted(fields))}")
        problem = field_problem(v, *fields[k])
        if problem:
            fail(f"launcher.{k}", problem)
        values[k] = v
    launcher = cls(**values)
    launcher.check(fail)
    return launcher


@functools.cache
def _fields(cls: type) -> dict[str, tuple[Any, Mapping[str, Any]]]:
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata) for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class Launcher(abc.ABC):
    """The interface every launcher implements (see the module docstring). Subclasses are frozen
    dataclasses whose fields are the keys of their `launcher:` block."""

    name: ClassVar[str] = ""  # set by register_launcher
    parallel_key: ClassVar[str] = "workers"  # the field `--workers` sets: runs at once
    study_file: ClassVar[str] = "optuna.db"  # an Optuna search's storage in the sweep folder (sqlite)

    def check(self, fail: Fail) -> None:
        """Checks across fields, after each field was checked alone (none unless a launcher adds them)."""
        return None

    def settings(self) -> dict[str, Any]:
        """name and every key, in the block's order (the dry run prints them)."""
        return {"name": self.name, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}

    @property
    def parallel_runs(self) -> int:
        return int(getattr(self, self.parallel_key) or 1)

    def with_parallel_runs(self, n: int) -> Launcher:
        return dataclasses.replace(self, **{self.parallel_key: n})

    @property
    def processes_per_run(self) -> int:
        """A run's world size: its nodes × processes on each."""
        return 1

    @property
    def gpus_per_run(self) -> int:
        """GPUs one run asks for (0: it uses what the machine has)."""
        return 0

    @property
    def nodes_per_run(self) -> int:
        """Nodes of one run (its processes are spread evenly over them)."""
        return 1

    def worker_threads(self) -> WorkerThreads:
        """What each worker process decides its torch threads from (stare_lab.launchers.threads): the
        launcher's `threads_per_worker` key when it has one, and the workers sharing one process's
        cores (1: each job has cores of its own)."""
        return WorkerThreads(per_worker=getattr(self, "threads_per_worker", None), sharing=1)

    @abc.abstractmethod
    def layout(self, runs: int) -> str:
        """The dry run's line: what one run and the sweep ask for."""

    @abc.abstractmethod
    def executor(self, folder: Path, job_name: str):
        """The submitit executor of this launcher's jobs (logs under `folder`)."""

    @abc.abstractmethod
    def starter(self, executor, workers: Workers) -> Starter:
        """How queued runs become jobs (stare_lab.launchers.jobs), submitting `workers`' callables."""

    def watch(self) -> JobWatch:
        """How a launch tells that a tracked run's job has ended."""
        return JobWatch()

    @abc.abstractmethod
    def stop(self, jobs: list, echo: Callable[[str], None]) -> None:
        """Ctrl-C in `sweep run`: what happens to the jobs still running, said in one line."""
