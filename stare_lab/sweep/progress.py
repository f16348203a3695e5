"""The progress of a launch: rich progress on a terminal, one line per ended run otherwise."""

from __future__ import annotations

from collections.abc import Callable

from rich import progress
from rich.console import Console

from stare_lab.launchers.run_spec import RunSpec
from stare_lab.record import read_status


class Progress:
    """rich progress on a terminal, one line per ended run otherwise."""

    def __init__(self, total: int, echo: Callable[[str], None]):
        self.total, self.echo, self.done, self._p = total, echo, 0, None

    def __enter__(self):
        if Console().is_terminal and self.total:
            columns = (progress.BarColumn(), progress.MofNCompleteColumn(), progress.TimeElapsedColumn())
            self._p = progress.Progress(progress.TextColumn("runs"), *columns)
            self._p.start()
            self._task = self._p.add_task("runs", total=self.total)
        return self.advance

    def advance(self, run: RunSpec, state: str) -> None:
        self.done += 1
        line = f"[{self.done}/{self.total}] {state:<11} {run.label}  ({run.id})"
        if state != "finished":
            err = (read_status(run.run_dir) or {}).get("error")
            line += f": {err}" if err else ""
        if self._p is not None:
            self._p.console.print(line, markup=False, highlight=False)
            self._p.advance(self._task)
        else:
            self.echo(line)

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.stop()
