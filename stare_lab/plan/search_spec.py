"""The `search:` block of a sweep file (an Optuna study instead of a grid), checked like the rest
of the file (stare_lab.plan.schema): one line naming the key path, the value and the choices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stare_lab.config.run_config import Config, field_problem, schema_fields
from stare_lab.plan.keys import check_key

if TYPE_CHECKING:
    from stare_lab.launchers import Launcher

SEARCH_KEYS = ("params", "objective", "trials", "parallelism", "sampler", "seed", "pruner", "storage")
SAMPLERS = ("tpe", "random")
PRUNERS = ("none", "median")
DIRECTIONS = ("maximize", "minimize")


@dataclass
class SearchSpec:
    params: dict[str, dict[str, Any]]  # dotted key -> {low, high, log, step, type} | {choices}
    metric: str  # eval/<benchmark>/<metric> or train/<key>
    direction: Literal["maximize", "minimize"]  # DIRECTIONS
    trials: int
    parallelism: int
    sampler: str = "tpe"
    seed: int = 0
    pruner: dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    storage: str | None = None  # None: the launcher's study file in the sweep folder (sqlite, or a journal)


def parse_search(block: Any, fail, launch: Launcher) -> SearchSpec:
    if not isinstance(block, dict):
        fail("search", "expected a mapping with params, objective and trials")
    for k in block:
        if k not in SEARCH_KEYS:
            fail(f"search.{k}", f"unknown key; valid keys: {', '.join(SEARCH_KEYS)}")
    params = block.get("params")
    if not isinstance(params, dict) or not params:
        fail("search.params", "expected a non-empty mapping of dotted keys to {low, high} or {choices}")
    for k, p in params.items():
        _param(k, p, fail)
    obj = block.get("objective")
    if not isinstance(obj, dict) or "metric" not in obj:
        fail(
            "search.objective",
            "expected {metric: eval/<benchmark>/<metric> | train/<key>, direction: maximize|minimize}",
        )
    for k in obj:
        if k not in ("metric", "direction"):
            fail(f"search.objective.{k}", "unknown key; valid keys: metric, direction")
    metric = obj["metric"]
    if not isinstance(metric, str) or not re.match(r"^(eval/[^/]+/\S+|train/\S+)$", metric):
        fail(
            "search.objective.metric",
            f"{metric!r}: expected eval/<benchmark>/<metric> (e.g. eval/arithmetic/avg@32) or train/<key>",
        )
    direction = obj.get("direction", "maximize")
    if direction not in DIRECTIONS:
        fail("search.objective.direction", f"unknown direction {direction!r}; valid: {', '.join(DIRECTIONS)}")
    ints = {}
    for k, lo in (("trials", 1), ("parallelism", 1), ("seed", 0)):
        v = block.get(k, {"trials": None, "parallelism": None, "seed": 0}[k])
        if k == "trials" and v is None:
            fail("search.trials", "missing: how many trials to run")
        if v is None:
            v = launch.parallel_runs
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            fail(f"search.{k}", f"expected an integer ≥ {lo}, got {v!r}")
        ints[k] = v
    sampler = block.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        fail("search.sampler", f"unknown sampler {sampler!r}; valid: {', '.join(SAMPLERS)}")
    pruner = block.get("pruner") or {"name": "none"}
    if isinstance(pruner, str):
        pruner = {"name": pruner}
    if not isinstance(pruner, dict) or pruner.get("name") not in PRUNERS:
        fail("search.pruner", f"unknown pruner {pruner!r}; valid: {', '.join(PRUNERS)}")
    for k in pruner:
        if k not in ("name", "n_startup_trials", "n_warmup_steps"):
            fail(f"search.pruner.{k}", "unknown key; valid keys: name, n_startup_trials, n_warmup_steps")
    storage = block.get("storage")
    if storage is not None and not isinstance(storage, str):
        fail("search.storage", f"expected a path or an sqlite:/// URL, got {storage!r}")
    return SearchSpec(
        params=params,
        metric=metric,
        direction=direction,
        trials=ints["trials"],
        parallelism=ints["parallelism"],
        sampler=sampler,
        seed=ints["seed"],
        pruner=pruner,
        storage=storage,
    )


def _param(key: Any, p: Any, fail) -> None:
    path = f"search.params.{key}"
    check_key(key, path, fail)
    if "." not in key:
        fail(path, "search parameters are dotted config keys (e.g. method.params.W)")
    if not isinstance(p, dict):
        fail(path, "expected {low, high[, log, step, type]} or {choices: [...]}")
    if "choices" in p:
        if set(p) != {"choices"} or not isinstance(p["choices"], list) or not p["choices"]:
            fail(path, "a categorical parameter is {choices: [non-empty list]}")
        for i, v in enumerate(p["choices"]):
            check_schema_value(key, v, f"{path}.choices[{i}]", fail)
        return
    for k in p:
        if k not in ("low", "high", "log", "step", "type"):
            fail(f"{path}.{k}", "unknown key; valid keys: low, high, log, step, type (or choices)")
    lo, hi = p.get("low"), p.get("high")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (lo, hi)):
        fail(path, f"low and high must be numbers, got low={lo!r} high={hi!r}")
    if lo >= hi:
        fail(path, f"low ({lo}) must be below high ({hi})")
    if p.get("type", "float" if isinstance(lo, float) or isinstance(hi, float) else "int") not in ("int", "float"):
        fail(f"{path}.type", f"unknown type {p.get('type')!r}; valid: int, float")
    if p.get("log") and lo <= 0:
        fail(path, "a log-scale range needs low > 0")
    check_schema_value(key, lo, f"{path}.low", fail)
    check_schema_value(key, hi, f"{path}.high", fail)


def check_schema_value(key: str, value: Any, path: str, fail) -> None:
    """A value for a dotted key of a schema section (trainer.max_steps) against that field."""
    section, _, leaf = key.partition(".")
    schema = schema_fields(Config).get(section, (None,))[0]
    fields = schema_fields(schema) if isinstance(schema, type) and hasattr(schema, "__dataclass_fields__") else {}
    if leaf in fields:
        problem = field_problem(value, *fields[leaf])
        if problem:
            fail(path, problem)
