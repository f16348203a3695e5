"""Reasoning Gym's registry as the config checks and the task read it: the installed library's datasets,
`task.datasets` parsed and checked (names with the closest ones offered, generator keys, the generator's
own refusals, weights), the `rg:<dataset>` benchmark names, and the seeds of the held-out streams.
Importing this module imports nothing heavy. Names and keys are checked against the committed listing
of the pinned version (reasoning_gym_registry.py), without the library; reasoning_gym (~1.6 s, no
torch) is imported only to try a config of a dataset's own keys on its generator, so that a misspelt
dataset or key, or an unknown `rg:<dataset>`, is refused in a fraction of a second.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import importlib.util
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from stare_lab.tasks.reasoning_gym_registry import DATASETS as LISTED
from stare_lab.tasks.reasoning_gym_registry import VERSION as LISTED_VERSION

PACKAGE_PIN = "reasoning-gym==0.1.25"
MISSING_PACKAGE = (
    "Reasoning Gym (task reasoning_gym, benchmarks rg:<dataset>) needs the reasoning-gym package, which is not "
    f"installed here: pip install {PACKAGE_PIN} (make install installs it)"
)
BENCHMARK_PREFIX = "rg:"
# keys of a dataset's generator config that the task sets itself (from task.seed, train_size, heldout_*)
_TASK_SET = ("seed", "size")


def installed() -> bool:
    return importlib.util.find_spec("reasoning_gym") is not None


@functools.cache
def registry() -> dict[str, tuple[type, type]]:
    """{dataset name: (dataset class, config dataclass)} of the installed library, without `composite`."""
    if not installed():
        raise ValueError(MISSING_PACKAGE)
    from reasoning_gym.factory import DATASETS  # deferred: ~1.6 s, only when the task's data is made or checked

    return {k: v for k, v in sorted(DATASETS.items()) if k != "composite"}


def installed_version() -> str | None:
    """The installed reasoning-gym's version, from its package metadata (the library is not imported)."""
    try:
        return importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def known_datasets() -> dict[str, tuple[str, ...]]:
    """{dataset name: its generator config's keys, without `seed` and `size`} of the installed library:
    the committed listing where the library is the version it lists (no import), else its registry."""
    if not installed():
        raise ValueError(MISSING_PACKAGE)
    if installed_version() == LISTED_VERSION:
        return LISTED
    return {k: tuple(f.name for f in fields(cfg) if f.name not in _TASK_SET) for k, (_, cfg) in registry().items()}


@dataclass(frozen=True)
class Spec:
    """One dataset of the mix: its name, weight (> 0) and the generator's own config keys."""

    name: str
    weight: float
    config: tuple[tuple[str, Any], ...]

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.config)


def parse_specs(value: Any) -> tuple[Spec, ...]:
    """`task.datasets` as specs, each checked against the library (ValueError, one line, on any problem)."""
    problem = specs_problem(json.dumps(value, sort_keys=True, default=str))
    if problem:
        raise ValueError(f"task.datasets: {problem}")
    return tuple(
        Spec(d["name"], float(d.get("weight", 1.0)), tuple(sorted((d.get("config") or {}).items()))) for d in value
    )


def datasets_problem(value: Any) -> str | None:
    """Why `task.datasets` can not be used, or None (the schema's check; cached per value)."""
    if not installed():
        return MISSING_PACKAGE
    try:
        key = json.dumps(value, sort_keys=True)
    except TypeError:
        return f"expected a list of {{name, weight, config}} mappings, got {value!r}"
    return specs_problem(key)


@functools.lru_cache(maxsize=256)
def specs_problem(key: str) -> str | None:
    value = json.loads(key)
    if not isinstance(value, list) or not value:
        return f"expected a non-empty list of {{name, weight, config}} mappings, got {value!r}"
    seen: set[str] = set()
    for i, d in enumerate(value):  # every entry's names, keys and weight first: no library needed
        if not isinstance(d, dict):
            return f"[{i}]: expected a mapping {{name, weight, config}}, got {d!r}"
        unknown = sorted(set(d) - {"name", "weight", "config"})
        if unknown:
            return f"[{i}]: unknown key {unknown[0]!r}; valid keys: name, weight, config"
        weight = d.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            return f"[{i}].weight: must be a number > 0, got {weight!r}"
        problem = keys_problem(d.get("name"), d.get("config") or {})
        if problem:
            return f"[{i}]{problem}"
        if d["name"] in seen:
            return f"[{i}].name: {d['name']!r} is listed twice"
        seen.add(d["name"])
    for i, d in enumerate(value):  # then the generators' own refusals
        problem = generator_problem(d["name"], d.get("config") or {})
        if problem:
            return f"[{i}]{problem}"
    return None


def dataset_problem(name: Any, config: Any) -> str | None:
    """Why a dataset with this generator config can not be generated (`.name: ...` / `.config...: ...`)."""
    return keys_problem(name, config) or generator_problem(name, config)


def keys_problem(name: Any, config: Any) -> str | None:
    """An unknown dataset (with the closest names) or config key (with the closest key), or a key the
    task sets: from the listing of the library's datasets (`known_datasets`), without importing it."""
    datasets = known_datasets()
    if name not in datasets:
        close = difflib.get_close_matches(str(name), list(datasets), n=3, cutoff=0.5)
        hint = f"; closest: {', '.join(close)}" if close else f"; {len(datasets)} datasets (docs/tasks.md)"
        return f".name: unknown Reasoning Gym dataset {name!r}{hint}"
    if not isinstance(config, dict):
        return f".config: expected a mapping of {name}'s generator keys, got {config!r}"
    keys = list(datasets[name])
    for key in config:
        if key in _TASK_SET:
            return f".config.{key}: set by the task (task.seed, task.train_size, task.heldout_*), not per dataset"
        if key not in keys:
            close = difflib.get_close_matches(str(key), keys, n=1)
            return f".config.{key}: unknown key for {name}" + (
                f" (did you mean {close[0]}?)" if close else f"; valid keys: {', '.join(keys)}"
            )
    return None


def generator_problem(name: str, config: dict[str, Any]) -> str | None:
    """The generator's own refusal of a config of its keys, or None. The library's defaults (`{}`) are
    not tried: every dataset generates at them (tests/tasks/test_reasoning_gym_registry.py), so only a
    config of a dataset's own keys imports the library."""
    if not config:
        return None
    try:
        create(name, config, seed=0, size=1)[0]  # validate() and one problem: some configs fail only there
    except Exception as e:  # the generator's own refusal: AssertionError, ValueError, TypeError, ...
        return f".config: {name} rejects {config!r}: {' '.join(str(e).split()) or type(e).__name__}"
    return None


def create(name: str, config: Mapping[str, Any], *, seed: int, size: int) -> Any:
    from reasoning_gym import create_dataset  # deferred: as in registry

    registry()
    return create_dataset(name, **dict(config), seed=seed, size=size)


def heldout_seed_of(name: str, heldout_seed: int) -> int:
    """The seed of a dataset's held-out stream: its own, whatever the other datasets of the mix are."""
    return (int(heldout_seed) + zlib.crc32(name.encode())) % 2**31


def heldout_budget(heldout_size: int) -> int:
    """How far a dataset's held-out stream is drawn (and its generator's `size`) to find its distinct questions."""
    return 2 * int(heldout_size) + 64


@functools.lru_cache(maxsize=256)
def benchmark_problem(name: str) -> str | None:
    """Why `rg:<dataset>` is not a benchmark, or None."""
    if not installed():
        return MISSING_PACKAGE
    problem = dataset_problem(name[len(BENCHMARK_PREFIX) :], {})
    return None if problem is None else f"benchmark {name!r}:{problem.split(':', 1)[1]}"
