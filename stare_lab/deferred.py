"""Deferring torch's import in the command line, so that a refused value never pays for it.

`import torch` costs ~1.3 s of CPU before a command can say anything, and the config checks import
the token rules (their `Params` validate a rule's parameters), whose modules `import torch` at the
top. `defer("torch")` puts a stand-in module in `sys.modules`: an `import torch` statement binds
it without running torch, and the first attribute anyone reads from it (`torch.ones`, `from torch
import Tensor`, `import torch.nn`) imports the real torch, after which every attribute is read from
the real module (a submodule imported meanwhile is handed back, not run twice: `_ImportedMeanwhile`).
So a value the checks refuse exits before torch is imported, and a command that goes on to train
imports it at its first use. The rule modules import `Tensor` for annotations only (TYPE_CHECKING).
Only `stare_lab.cli.main` calls `defer`; importing stare_lab as a library imports torch as usual.

Why not `importlib.util.LazyLoader`: on Python 3.11 the `import` statement itself reads the
module's `__spec__`, which makes a LazyLoader module load at once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types


class _Deferred(types.ModuleType):
    """Stands in for a module until its first attribute is read; then forwards to the real one."""

    def __init__(self, name: str, spec) -> None:
        super().__init__(name)
        self.__spec__ = spec  # what the import statement reads: found here, no import
        self.__dict__["_real"] = None

    def _load(self) -> types.ModuleType:
        real = self.__dict__["_real"]
        if real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
            self.__dict__["_real"] = real
        return real

    def __getattr__(self, attr: str):  # only for names not in the stand-in's own __dict__
        return getattr(self._load(), attr)

    def __setattr__(self, attr: str, value) -> None:
        # before the load, the import system's own dunders stay here; every other write is the real module's
        if attr == "__spec__" or (self.__dict__["_real"] is None and attr.startswith("__")):
            super().__setattr__(attr, value)
        else:
            setattr(self._load(), attr, value)

    def __dir__(self):
        return dir(self._load())


class _ImportedMeanwhile(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Hands back a submodule that loading its deferred parent has just imported.

    `import torch.nn` looks in sys.modules, then reads the parent's `__path__`: reading it from the
    stand-in imports the real torch, which imports torch.nn itself, and the import system, which does
    not look again, would run torch/nn/__init__.py a second time. This finder, first on the meta path,
    answers for a submodule of a deferred module that is already in sys.modules with that very
    module, and gives it back its own spec (`importlib.reload` of such a submodule is then a no-op).
    """

    def __init__(self) -> None:
        self._specs: dict[str, object] = {}
        self.roots: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        module = sys.modules.get(name)
        if module is None or name.partition(".")[0] not in self.roots:
            return None
        self._specs[name] = getattr(module, "__spec__", None)
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        return sys.modules[spec.name]

    def exec_module(self, module) -> None:
        module.__spec__ = self._specs.pop(module.__name__)


_FINDER = _ImportedMeanwhile()


def defer(name: str) -> None:
    """Stand in for module `name` until it is used (no effect if it is already imported or absent)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        return
    _FINDER.roots.add(name)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    sys.modules[name] = _Deferred(name, spec)


def is_loaded(name: str) -> bool:
    """Whether the real module `name` has been imported (a deferred stand-in alone does not count)."""
    module = sys.modules.get(name)
    return module is not None and not (isinstance(module, _Deferred) and module.__dict__["_real"] is None)
