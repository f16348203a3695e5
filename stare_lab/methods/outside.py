"""Rules kept outside the package (docs/rules_outside.md): importing their modules before anything
checks a rule's name, carrying them to every worker, and what each run records of them.

A rule registers when its module is imported (stare_lab.methods.registry). Three ways to have it
imported, as pytest plugins or Hydra's searchpath are found:
- a sweep's top-level `imports:`: module names, found in the sweep file's folder first, then on
  sys.path (PYTHONPATH, installed packages);
- `--import MODULE` (repeatable) of `train`, `sweep run` and `eval`: found in the current folder
  first, then on sys.path;
- the entry-point group `stare_lab.rules` of an installed package (`name = "package.module"`):
  the registry loads the group the first time it lists its rules or is asked for a name it does not
  know, so a pip-installed package's rules register without being named.

The command imports them before it checks anything: a module that can not be imported is one line
naming it and its error, exit 2, nothing created. Each run's config then carries `run.imports`, a
list of {module, path} (path: the folder the module was found in), which the worker (local or
Slurm, every rank) imports before it builds the rule (`import_run_modules`), so no launcher needs to
know. `run.imports` is outside the config schema and the run id: like the rest of the run block it
says how a run is executed, not what it computes. The run's record (status.json, each attempt's
`provenance`) lists every outside module it imported with its file and sha256 (`rule_modules`)
beside the project's own commit; `record.code_version` counts the one that defines the run's rule
(an edited rule file makes its finished runs "other code"; the runs of other rules stay current).

Reading commands (`status`, `table`, `plot`, `view`) import none of it: under `reading()` the
registry loads no entry point and a sweep's `imports:` are not imported; runs of a rule the
registry does not know take their ids from their records (stare_lab.plan.expand).
"""

from __future__ import annotations

import hashlib
import importlib
import re
import sys
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

ENTRY_POINT_GROUP = "stare_lab.rules"
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_STATE: dict[str, Any] = {"reading": False, "entry_points": None}
_SHA: dict[tuple[str, int, int], str] = {}


class RuleImportError(ValueError):
    """A module of rules that can not be imported (one line: which, from where, its error); the
    command line's mistake, exit 2 (this module imports nothing of stare_lab: the registry imports it)."""


@dataclass(frozen=True)
class Imported:
    """An imported module of rules: its name, the sys.path folder it was found in, its file and hash."""

    module: str
    path: str | None  # None: no file (a namespace package); the worker then finds it on its sys.path
    file: str | None
    sha256: str | None

    def run_entry(self) -> dict[str, Any]:
        """What a run's config carries (`run.imports`) for its worker to import it."""
        return {"module": self.module, "path": self.path}

    def record(self) -> dict[str, Any]:
        """What a run's record says of it (status.json provenance)."""
        return {"module": self.module, "file": self.file, "sha256": self.sha256}


def module_name_problem(name: Any) -> str | None:
    """Why `name` is not an importable module name, or None."""
    if isinstance(name, str) and _MODULE_NAME.match(name):
        return None
    if isinstance(name, str) and name.endswith(".py"):
        return f"{name!r} is a file name; write the module name ({Path(name).stem!r} for {name})"
    return f"{name!r} is not a module name (dotted identifiers, e.g. my_rules or lab.rules)"


def import_modules(names: Iterable[str], folder: Path | str | None, source: str) -> list[Imported]:
    """Import each module, searching `folder` first, then sys.path; RuleImportError (one line
    starting with `source`) for a bad name or a failed import."""
    out = []
    for name in names:
        problem = module_name_problem(name)
        if problem:
            raise RuleImportError(f"{source}: {problem}")
        out.append(import_module(name, folder, source))
    return out


def import_module(name: str, folder: Path | str | None, source: str) -> Imported:
    """Import `name` with `folder` (if any) first on sys.path, where it stays (a rule may import a
    module beside it when it runs)."""
    searched = "searched sys.path (PYTHONPATH)"
    if folder is not None:
        entry = str(Path(folder).expanduser().absolute())
        if entry not in sys.path:
            sys.path.insert(0, entry)
        searched = f"searched {entry}, then sys.path (PYTHONPATH)"
    importlib.invalidate_caches()  # a module written since this process last listed the folder
    try:
        module = importlib.import_module(name)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure of the user's module is one line
        raise RuleImportError(f"{source}: cannot import rule module {name!r} ({searched}): {error_line(e)}") from None
    return describe_module(module)


def describe_module(module: Any) -> Imported:
    file = getattr(module, "__file__", None)
    if not file:
        return Imported(module.__name__, None, None, None)
    f = Path(file).absolute()
    depth = module.__name__.count(".") + (1 if f.name == "__init__.py" else 0)
    return Imported(module.__name__, str(f.parents[depth]), str(f), file_sha256(f))


def file_sha256(path: Path) -> str | None:
    try:
        st = path.stat()
        key = (str(path), st.st_mtime_ns, st.st_size)
        if key not in _SHA:
            _SHA[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        return _SHA[key]
    except OSError:
        return None


def error_line(e: BaseException) -> str:
    """`NameError: name 'x' is not defined (/tmp/mine.py, line 12)`: the error and, when it was
    raised inside the user's code, where."""
    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} ({e.filename}, line {e.lineno})"
    text = str(e).strip().splitlines()
    line = f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
    here = Path(__file__).resolve()
    user = [
        fr
        for fr in traceback.extract_tb(e.__traceback__)
        if not fr.filename.startswith("<") and "importlib" not in fr.filename and Path(fr.filename).resolve() != here
    ]
    return f"{line} ({user[-1].filename}, line {user[-1].lineno})" if user else line


def run_entries(imported: Iterable[Imported]) -> list[dict[str, Any]]:
    """`run.imports` of a run: each module once, in import order."""
    seen: dict[str, dict[str, Any]] = {}
    for i in imported:
        seen.setdefault(i.module, i.run_entry())
    return list(seen.values())


def import_run_modules(run_cfg: Any, source: str = "run.imports") -> list[Imported]:
    """Import the modules a run's config names (`run.imports`; none in a run without them)."""
    entries = (run_cfg.get("imports") if run_cfg is not None else None) or []
    return [import_module(str(e["module"]), e.get("path"), source) for e in entries]


def rule_modules(origin: str | None, imported: Iterable[Imported]) -> list[dict[str, Any]]:
    """The record of the outside modules a run uses: its `run.imports` and `origin`, the module that
    registered its rule (`registry.rule_module`: None for a rule of stare_lab's, or one the registry
    does not know, whose run then fails naming it), when that is none of them (an entry point's). The
    one that registered the run's rule has `defines_rule` true."""
    records = {i.module: i.record() for i in imported}
    if origin is not None and origin not in records and origin in sys.modules:
        records[origin] = describe_module(sys.modules[origin]).record()
    for module, record in records.items():
        record["defines_rule"] = module == origin  # the one `code_version` counts
    return list(records.values())


def current_rule_modules(config: dict[str, Any], origin: str | None) -> list[dict[str, Any]]:
    """`rule_modules` of a run as this process has them now (the driver imported them): what a
    finished run's record is compared with to tell whether it ran other code (sweep.plan)."""
    entries = (config.get("run") or {}).get("imports") or []
    imported = [describe_module(sys.modules[e["module"]]) for e in entries if e["module"] in sys.modules]
    return rule_modules(origin, imported)


def load_entry_points() -> list[Imported]:
    """Import every module of the `stare_lab.rules` entry-point group, in (package, name) order;
    RuleImportError naming the entry point and its package when one fails."""

    def dist(ep) -> str:
        d = getattr(ep, "dist", None)
        return f"{d.name} {d.version}" if d is not None else "an unknown package"

    out = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (dist(e), e.name)):
        try:
            ep.load()
        except (Exception, SystemExit) as e:  # noqa: BLE001 - one line naming the entry point
            raise RuleImportError(
                f"entry point {ep.name!r} = {ep.value!r} of group {ENTRY_POINT_GROUP} (package {dist(ep)}): "
                f"cannot import it: {error_line(e)}"
            ) from None
        module = sys.modules.get(ep.module)
        if module is not None:
            out.append(describe_module(module))
    return out


def load_entry_points_once() -> None:
    """`load_entry_points` the first time it is asked outside a reading command; a failure is kept
    and raised again (a module half-run by a failed import is not run twice)."""
    state = _STATE["entry_points"]
    if isinstance(state, Exception):
        raise state
    if state is not None or _STATE["reading"]:
        return
    _STATE["entry_points"] = "loading"  # a plugin that lists the rules while it is imported
    try:
        load_entry_points()
    except Exception as e:
        _STATE["entry_points"] = e
        raise
    _STATE["entry_points"] = "loaded"


@contextmanager
def reading() -> Iterator[None]:
    """Within: a reading command; no outside code is imported (no entry point, no `imports:`)."""
    before = _STATE["reading"]
    _STATE["reading"] = True
    try:
        yield
    finally:
        _STATE["reading"] = before


def is_reading() -> bool:
    return bool(_STATE["reading"])
