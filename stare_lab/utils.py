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
