"""Sweep files: load a sweep YAML and check it against the schema before anything starts.

Every mistake is a `SweepError` whose message is one line naming the file, the key path and,
where there is a closed set, the valid choices: `sweeps/x.yaml: grid.method[2]: unknown method
option 'nope'; valid: anchor, full, ...`. The schema is documented in docs/sweeps.md.
This module checks the shape of the file and each value it can check alone against the config
schemas (the `search:` block: search_spec.py; the `launcher:` block: launchers/); whether each run
composes into a valid config is checked by `expand.expand_sweep`, which reports errors in the same
form. Size, encoding and run count are limited (MAX_FILE_BYTES, MAX_RUNS), so a huge file or grid is
refused at once.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from stare_lab.config.run_config import (
    Config,
    EvalConfig,
    field_problem,
    group_names,
    group_options,
    packaged_sweeps,
    schema_fields,
    section_schema,
    sweep_path,
)
from stare_lab.core.controls import BASE, CONTROLS
from stare_lab.launchers import Launcher, launcher_defaults, parse_launcher  # noqa: F401 - launcher_defaults: tests
from stare_lab.launchers.errors import SweepError
from stare_lab.methods import list_methods
from stare_lab.methods.outside import Imported, RuleImportError, import_modules, is_reading, module_name_problem
from stare_lab.methods.registry import OUTSIDE_HINT, is_registered
from stare_lab.plan.claims import Claim, parse_claims
from stare_lab.plan.design import Design, design_seeds, parse_design
from stare_lab.plan.keys import check_key
from stare_lab.plan.records import recorded_configs
from stare_lab.plan.search_spec import SearchSpec, parse_search

TOP_KEYS = (
    "name",
    "description",
    "imports",
    "base",
    "grid",
    "variants",
    "controls",
    "seeds",
    "eval",
    "launcher",
    "output",
    "search",
    "claims",
    "design",
)
EVAL_KEYS = tuple(schema_fields(EvalConfig))
# A sweep file is written by hand (the shipped ones are < 3 kB); a bigger one is refused unread.
MAX_FILE_BYTES = 1 << 20
# Runs of one sweep: 10,000 expand in under a second; past this a sweep is refused before expansion.
MAX_RUNS = 50_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Variant names may carry a bracketed setting, read by analysis as the arm: "rsi_band[0.5,1]".
_VARIANT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.,=+\[\]-]*$")


@dataclass
class SweepSpec:
    name: str
    groups: dict[str, str]  # config group -> option (base choices)
    overrides: dict[str, Any]  # base dotted overrides, eval block included
    grid: dict[str, list[Any]]
    variants: dict[str, dict[str, Any]]
    seeds: list[int]
    launcher: Launcher  # stare_lab.launchers: every parameter, defaults filled in
    output: Path  # absolute root; the sweep folder is output/name
    search: SearchSpec | None = None
    path: Path | None = None
    description: str = ""
    digest: str = ""  # sha256 of the file text: status notices an edited sweep
    imports: list[str] = field(default_factory=list)  # the file's `imports:` (module names)
    # the modules of rules imported for this sweep (`imports:` and `--import`): every run's `run.imports`
    imported: list[Imported] = field(default_factory=list)
    reading: bool = False  # loaded for a reading command: nothing imported, unknown rules read from records
    claims: list[Claim] = field(default_factory=list)  # the file's `claims:` (stare_lab.plan.claims)
    controls: list[str] = field(default_factory=list)  # `controls:` (stare_lab.core.controls): base, random_reward
    design: Design | None = None  # `design:`: the claims decided in looks (stare_lab.plan.design)

    @property
    def folder(self) -> Path:
        return self.output / self.name

    def where(self) -> str:
        return str(self.path) if self.path else "<sweep>"


def config_groups() -> list[str]:
    """Config groups a sweep may choose in `base`, `grid` or a variant (not the launcher)."""
    return [g for g in group_names() if g != "launcher"]


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last one silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise SweepError(
                f"line {key_node.start_mark.line + 1}: duplicate key {key!r} (first at line {seen[key] + 1})"
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_sweep(
    path: Path | str,
    *,
    launcher: dict[str, Any] | None = None,
    output: Path | str | None = None,
    imported: list[Imported] | None = None,
    reading: bool | None = None,
) -> SweepSpec:
    """Read and validate a sweep file (a path or a packaged sweep's name, see `config.sweep_path`).
    `launcher` (CLI options) and `output` override the file. The file's `imports:` are imported
    (from its folder first) before its rule names are checked; `imported`: modules the command
    line imported already (`--import`), carried to the runs with them. `reading` (default: whether
    this is a reading command, stare_lab.methods.outside.reading): import nothing, accept a rule name
    the registry does not know (its runs are read from their records, sweep.expand)."""
    path, text, data = read_sweep_file(path)
    spec = parse_sweep(
        data, where=str(path), launcher=launcher, output=output, folder=path.parent, imported=imported, reading=reading
    )
    spec.path, spec.digest = path, hashlib.sha256(text.encode()).hexdigest()
    return spec


def read_sweep_file(path: Path | str) -> tuple[Path, str, Any]:
    """(the file's path, its text, its YAML data) of a sweep file or a packaged sweep's name; a file that
    is missing, too big, not UTF-8 or not YAML (or repeats a key) is a SweepError naming it."""
    path = sweep_path(path)
    if not path.is_file():
        raise SweepError(f"{path}: no such sweep file (or packaged sweep name: {', '.join(packaged_sweeps())})")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise SweepError(
            f"{path}: {size:,} bytes; a sweep file is at most {MAX_FILE_BYTES:,} bytes "
            "(list values in grid:, seeds: N for N seeds)"
        )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SweepError(
            f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at line {line}); save it as UTF-8"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except SweepError as e:
        raise SweepError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise SweepError(f"{path}: invalid YAML: {where}{getattr(e, 'problem', None) or e}") from None
    return path, text, data


def parse_sweep(
    data: Any,
    *,
    where: str = "<sweep>",
    launcher: dict[str, Any] | None = None,
    output: Path | str | None = None,
    folder: Path | None = None,
    imported: list[Imported] | None = None,
    reading: bool | None = None,
) -> SweepSpec:
    """A sweep's data checked (`load_sweep`; `folder`: where its `imports:` are searched first)."""

    def fail(key: str, msg: str) -> NoReturn:
        raise SweepError(f"{where}: {key}: {msg}" if key else f"{where}: {msg}")

    reading = is_reading() if reading is None else reading
    if not isinstance(data, dict):
        fail("", "a sweep file is a mapping with keys " + ", ".join(TOP_KEYS))
    for k in data:
        if k not in TOP_KEYS:
            fail("", f"unknown key {k!r}; valid keys: {', '.join(TOP_KEYS)}")
    for k in ("name", "base"):
        if k not in data:
            fail("", f"missing required key {k!r}")
    name = data["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        fail("name", f"{name!r} is not a valid sweep name (letters, digits, '_', '-', '.')")
    imports = _imports(data.get("imports"), fail)
    imported = list(imported or [])
    if not reading:  # before any rule name is checked: the modules register their rules
        try:
            imported += import_modules(imports, folder, f"{where}: imports")
        except RuleImportError as e:
            raise SweepError(str(e)) from None
    out = output if output is not None else data.get("output", "runs")
    if not isinstance(out, (str, Path)) or not str(out):
        fail("output", f"expected a folder path, got {out!r}")
    out_path = Path(out).expanduser().absolute()
    choices = _MethodChoices(reading, out_path / name)
    groups, overrides = _base(data["base"], fail, choices)
    overrides.update(_eval(data.get("eval"), fail))
    grid = _grid(data.get("grid"), fail, choices)
    variants = _variants(data.get("variants"), fail, grid, choices)
    claims = parse_claims(data.get("claims"), fail)
    design = parse_design(data.get("design"), claims, fail)
    seeds = _seeds(data.get("seeds", [0]) if design is None else design_seeds(design, data.get("seeds"), fail), fail)
    controls = _controls(data.get("controls"), fail)
    launch = parse_launcher(data.get("launcher"), launcher or {}, fail)
    search = None
    if data.get("search") is not None:
        if grid or variants:
            fail("search", "a search replaces grid and variants; remove one or the other")
        if len(seeds) != 1:
            fail("seeds", f"a search runs one seed per trial; got {len(seeds)} seeds")
        search = parse_search(data["search"], fail, launch)
    if search is not None and controls:
        fail("controls", "a search runs trials, not arms; controls go with a grid")
    _check_run_count(grid, variants, seeds, fail)
    if claims and search is not None:
        fail("claims", "a search has no arms to compare; claims belong to a grid or variants sweep")
    desc = data.get("description") or ""
    return SweepSpec(
        name=name,
        groups=groups,
        overrides=overrides,
        grid=grid,
        variants=variants,
        seeds=seeds,
        launcher=launch,
        output=out_path,
        search=search,
        description=str(desc),
        imports=imports,
        imported=imported,
        reading=reading,
        controls=controls,
        claims=claims,
        design=design,
    )


def _controls(block: Any, fail) -> list[str]:
    """`controls: [base, random_reward]`: the arms that are not rules (stare_lab.core.controls)."""
    if block is None:
        return []
    if not isinstance(block, list) or not all(isinstance(c, str) for c in block):
        fail("controls", f"expected a list of control names ({', '.join(CONTROLS)}), got {block!r}")
    for i, name in enumerate(block):
        if name not in CONTROLS:
            close = difflib.get_close_matches(name, CONTROLS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            fail(f"controls[{i}]", f"unknown control {name!r}{hint}; valid: {', '.join(CONTROLS)}")
        if name in block[:i]:
            fail(f"controls[{i}]", f"{name!r} is listed twice")
    return list(block)


def _imports(block: Any, fail) -> list[str]:
    """The `imports:` list: module names of rules kept outside the package (stare_lab.methods.outside)."""
    if block is None:
        return []
    if not isinstance(block, list) or not block:
        fail("imports", f"expected a non-empty list of module names (e.g. [my_rules]), got {block!r}")
    for i, name in enumerate(block):
        problem = module_name_problem(name)
        if problem:
            fail(f"imports[{i}]", problem)
    if len(set(block)) != len(block):
        fail("imports", f"duplicate module names in {block!r}")
    return list(block)


class _MethodChoices:
    """The method names a sweep may choose. Running: the registry's (entry points and the imported
    modules included); an unknown name is refused with the valid ones. Reading (`status`, `table`,
    `plot`, `view`): any name is taken, and `all` is the registry's rules plus those the sweep's
    records ran (rules registered from outside when it ran, not imported now)."""

    def __init__(self, reading: bool, folder: Path):
        self.reading, self.folder = reading, folder

    def check(self, value: Any, path: str, fail) -> None:
        if self.reading and isinstance(value, str) and _NAME.match(value):
            return
        _check_choice("method", value, path, fail)

    def all(self) -> list[str]:
        names = list(list_methods())  # registration order
        if self.reading:
            names += [n for n in recorded_methods(self.folder) if n not in names]
        return names


def recorded_methods(folder: Path) -> list[str]:
    """Rule names of the run records under a sweep folder, in folder order."""
    names: dict[str, None] = {}
    for cfg in recorded_configs(folder):
        names.setdefault(str((cfg.get("method") or {}).get("name")), None)
    return list(names)


def _check_choice(group: str, value: Any, path: str, fail) -> None:
    if group == "method" and isinstance(value, str):
        if not is_registered(value) and value != BASE:
            fail(path, f"unknown method option {value!r}; valid: {', '.join(group_options(group))}; {OUTSIDE_HINT}")
        return
    options = group_options(group)
    if not isinstance(value, str) or value not in options:
        fail(path, f"unknown {group} option {value!r}; valid: {', '.join(options)}")


def _split(mapping: dict, path: str, fail, choices: _MethodChoices) -> tuple[dict[str, str], dict[str, Any]]:
    """Config-group choices (`method: stare`) and dotted overrides (`method.params.W: 1.2`)."""
    groups, overrides = {}, {}
    known = config_groups()
    for k, v in mapping.items():
        check_key(k, f"{path}.{k}" if path else str(k), fail)
        if "." not in k and k in known:
            (choices.check if k == "method" else functools.partial(_check_choice, k))(v, f"{path}.{k}", fail)
            groups[k] = v
        elif "." not in k:
            fail(
                f"{path}.{k}",
                f"unknown config group {k!r}; valid groups: {', '.join(known)} "
                "(or a dotted key such as trainer.max_steps)",
            )
        else:
            if isinstance(v, dict) and section_schema(k) is None:
                fail(f"{path}.{k}", "an override value is a scalar or a list, not a mapping")
            overrides[k] = v
    return groups, overrides


def _base(base: Any, fail, choices: _MethodChoices) -> tuple[dict[str, str], dict[str, Any]]:
    if not isinstance(base, dict):
        fail("base", f"expected a mapping of config-group choices and `overrides:`, got {type(base).__name__}")
    groups, overrides = _split({k: v for k, v in base.items() if k != "overrides"}, "base", fail, choices)
    extra = base.get("overrides") or {}
    if not isinstance(extra, dict):
        fail("base.overrides", f"expected a mapping of dotted keys to values, got {type(extra).__name__}")
    for k in extra:
        if isinstance(k, str) and "." not in k:
            fail(
                f"base.overrides.{k}",
                f"{k!r} is a group choice or a section: write it under base: "
                "or use a dotted key such as trainer.max_steps",
            )
    g2, o2 = _split(extra, "base.overrides", fail, choices)
    overrides.update(o2)
    return groups, overrides


def _eval(block: Any, fail) -> dict[str, Any]:
    if block is None:
        return {}
    if block is False:
        return {"eval.enabled": False}
    if not isinstance(block, dict):
        fail("eval", f"expected a mapping with keys {', '.join(EVAL_KEYS)} (or false), got {block!r}")
    fields = schema_fields(EvalConfig)
    for k, v in block.items():
        if k not in fields:
            fail(
                f"eval.{k}",
                f"unknown key; valid keys: {', '.join(EVAL_KEYS)} (choose eval configs in base: eval: NAME)",
            )
        problem = field_problem(v, *fields[k])
        if problem:
            fail(f"eval.{k}", problem)
    if "benchmarks" in block and (not block["benchmarks"] or not all(isinstance(b, str) for b in block["benchmarks"])):
        fail("eval.benchmarks", "expected a non-empty list of benchmark names")
    return {f"eval.{k}": v for k, v in block.items()}


def _grid(grid: Any, fail, choices: _MethodChoices) -> dict[str, list[Any]]:
    if grid is None:
        return {}
    if not isinstance(grid, dict) or not grid:
        fail("grid", "expected a non-empty mapping of keys to lists of values")
    out = {}
    for k, values in grid.items():
        check_key(k, f"grid.{k}", fail)
        if values == "all" and k in config_groups():  # every option; for method, every registered rule
            values = choices.all() if k == "method" else group_options(k)
        if not isinstance(values, list):
            fail(f"grid.{k}", f"expected a list of values, got {values!r}")
        if not values:
            fail(f"grid.{k}", "empty list: a grid axis needs at least one value")
        for i, v in enumerate(values):
            if isinstance(v, dict) and section_schema(k) is None:
                fail(f"grid.{k}[{i}]", "a grid value is a scalar or a list (bundles of overrides are variants)")
            if "." not in k:
                if k not in config_groups():
                    fail(f"grid.{k}", f"unknown config group {k!r}; valid groups: {', '.join(config_groups())}")
                (choices.check if k == "method" else functools.partial(_check_choice, k))(v, f"grid.{k}[{i}]", fail)
        if len({repr(v) for v in values}) != len(values):
            fail(f"grid.{k}", f"duplicate values in {values!r}")
        out[k] = values
    return out


def _check_run_count(grid: dict[str, list[Any]], variants: dict[str, Any], seeds: list[int], fail) -> None:
    sizes = [len(v) for v in grid.values()] + [max(len(variants), 1), len(seeds)]
    if math.prod(sizes) > MAX_RUNS:
        fail(
            "",
            f"{math.prod(sizes):,} runs (grid {' × '.join(str(len(v)) for v in grid.values()) or '1'} × "
            f"{max(len(variants), 1)} variants × {len(seeds):,} seeds); a sweep is at most {MAX_RUNS:,} runs: "
            "split it or search it (search:)",
        )


def _variants(variants: Any, fail, grid: dict[str, list[Any]], choices: _MethodChoices) -> dict[str, dict[str, Any]]:
    if variants is None:
        return {}
    if not isinstance(variants, dict) or not variants:
        fail("variants", "expected a non-empty mapping of variant names to override bundles")
    out = {}
    for name, bundle in variants.items():
        if not isinstance(name, str) or not _VARIANT.match(name):
            fail(f"variants.{name}", f"{name!r} is not a valid variant name (letters, digits and _ . , = + - [ ])")
        if not isinstance(bundle, dict) or not bundle:
            fail(f"variants.{name}", "expected a non-empty mapping of overrides (e.g. method: rsi_band)")
        groups, overrides = _split(bundle, f"variants.{name}", fail, choices)
        merged = {**groups, **overrides}
        for k in merged:
            if k in grid:
                fail(f"variants.{name}.{k}", "also set by the grid; a key is either a grid axis or set by variants")
        out[name] = merged
    seen: dict[str, str] = {}
    for name, bundle in out.items():
        key = repr(sorted(bundle.items(), key=lambda kv: kv[0]))
        if key in seen:
            fail(f"variants.{name}", f"same overrides as variants.{seen[key]}")
        seen[key] = name
    return out


def _seeds(seeds: Any, fail) -> list[int]:
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            fail("seeds", f"a number of seeds must be ≥ 1, got {seeds}")
        if seeds > MAX_RUNS:
            fail("seeds", f"{seeds:,} seeds; a sweep is at most {MAX_RUNS:,} runs")
        return list(range(seeds))
    if not isinstance(seeds, list) or not seeds:
        fail("seeds", f"expected a non-empty list of integers or a count, got {seeds!r}")
    seed_field = schema_fields(Config)["seed"]
    for i, s in enumerate(seeds):
        problem = field_problem(s, *seed_field)
        if problem:
            fail(f"seeds[{i}]", problem)
    if len(set(seeds)) != len(seeds):
        fail("seeds", f"duplicate seeds in {seeds}")
    return list(seeds)
