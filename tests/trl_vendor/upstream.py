"""Finds TRL's own test suite for the installed TRL and substitutes our trainer into it (ORIGIN.md).

TRL's test files are not in this repository: they are read from a checkout of huggingface/trl at
the installed version's tag, named by STARE_TRL_TESTS (its `tests/` folder) or found at
~/.cache/stare_lab/trl-<version>/tests. The module is imported as the package `trl_upstream_tests`
(its relative imports of `testing_utils` resolve there), and two names in its namespace are
replaced; no test body is edited:
- `GRPOTrainer`: TokenRuleGRPOTrainer with rule `full` (STARE_TRL_PARITY_TRAINER=plain keeps TRL's,
  for the baseline count);
- `load_dataset`: the local stand-in datasets (standins.py).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

import trl

PACKAGE = "trl_upstream_tests"
SUITE = "test_grpo_trainer"


def tests_dir() -> Path:
    env = os.environ.get("STARE_TRL_TESTS")
    return Path(env) if env else Path.home() / ".cache" / "stare_lab" / f"trl-{trl.__version__}" / "tests"


def checkout_version(folder: Path) -> str | None:
    version = folder.parent / "VERSION"
    return version.read_text().strip() if version.is_file() else None


def why_not_runnable(folder: Path) -> str | None:
    """None when the suite can run; else the reason, one line."""
    if not (folder / f"{SUITE}.py").is_file():
        return (f"TRL's tests are not at {folder}: clone huggingface/trl at tag v{trl.__version__} and set "
                f"STARE_TRL_TESTS to its tests/ folder (tests/trl_vendor/ORIGIN.md)")
    found = checkout_version(folder)
    if found != trl.__version__ and not os.environ.get("STARE_TRL_TESTS_ANY_VERSION"):
        return (f"the checkout at {folder} is TRL {found}, the installed TRL is {trl.__version__} "
                f"(set STARE_TRL_TESTS_ANY_VERSION=1 to run it anyway)")
    return None


def load(folder: Path):
    """TRL's test module and its conftest, imported from `folder` as the package trl_upstream_tests."""
    if PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(PACKAGE, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        if (folder / "__init__.py").is_file():
            spec.loader.exec_module(package)
    suite = _import_with_skew(f"{PACKAGE}.{SUITE}") if _skewed(folder) else importlib.import_module(f"{PACKAGE}.{SUITE}")
    conftest = importlib.import_module(f"{PACKAGE}.conftest") if (folder / "conftest.py").is_file() else None
    return suite, conftest


def _skewed(folder: Path) -> bool:
    return checkout_version(folder) != trl.__version__


def _import_with_skew(name: str):
    """Import a suite written for another TRL: an `is_X_available` it imports that this TRL lacks answers False.

    Only for a checkout whose version differs from the installed TRL (STARE_TRL_TESTS_ANY_VERSION).
    """
    import trl.import_utils as iu

    for _ in range(20):
        try:
            return importlib.import_module(name)
        except ImportError as e:
            missing = re.match(r"cannot import name '(is_\w+_available)' from 'trl.import_utils'", str(e))
            if not missing:
                raise
            setattr(iu, missing.group(1), lambda: False)
            for stale in [m for m in sys.modules if m.startswith(PACKAGE + ".")]:
                del sys.modules[stale]
    raise ImportError(f"{name}: too many missing names in trl.import_utils")


def ours_full():
    """A class that TRL's tests can call and subclass-check like GRPOTrainer: ours with rule `full`."""
    from stare_lab.methods import get_method
    from stare_lab.training.trainer import TokenRuleGRPOTrainer

    class GRPOTrainer(TokenRuleGRPOTrainer):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("rule", get_method("full"))
            super().__init__(*args, **kwargs)

    return GRPOTrainer


def substitute(suite, trainer: str) -> None:
    from standins import load_dataset

    if trainer not in ("ours", "plain"):
        raise ValueError(f"STARE_TRL_PARITY_TRAINER={trainer!r}: use ours or plain")
    if trainer == "ours":
        suite.GRPOTrainer = ours_full()
    suite.load_dataset = load_dataset
