"""Expansion: a validated sweep → one `RunSpec` per run (grid × variants × seeds). A pure function.

A run is named by `run.id`, the hash of its resolved config (stare_lab.config.run_config.run_id), and
labelled by its override delta ("top_entropy rho=0.1 seed=0"). `RunSpec.overrides` are the
Hydra overrides that `stare_lab.config.run_config.compose` turns into the same resolved config.

Composing 10,000 runs through Hydra takes minutes (~0.2 s each), so expansion composes the base
once with Hydra, swaps config-group files in for other group choices, and applies the dotted
overrides to plain dicts, converting each distinct value through the dataclass schema once.
`verify_run` checks a run against the real `compose`; the launcher does so before it starts
anything, and the tests do it for every run of the shipped sweeps.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf

from stare_lab.config.run_config import (
    CONF_DIR,
    Config,
    ConfigError,
    check_values,
    compose,
    finalize,
    hydra_raw,
    rule_params,
    section_schema,
)
from stare_lab.config.server_layout import server_layout
from stare_lab.core.controls import BASE, control_overrides
from stare_lab.launchers.run_spec import RunSpec
from stare_lab.methods import TrainerValues
from stare_lab.methods.outside import run_entries
from stare_lab.methods.registry import is_registered
from stare_lab.plan.records import resolve_from_records
from stare_lab.plan.schema import SweepError, SweepSpec, config_groups


def fmt_value(v: Any) -> str:
    """A value in Hydra override syntax that parses back to the same value and type."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, dict):  # a section's value (model.lora: {r: 8})
        return "{" + ",".join(f"{k}:{fmt_value(x)}" for k, x in v.items()) + "}"
    s = str(v)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s) and s.lower() not in ("null", "true", "false", "inf", "nan"):
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def expand_sweep(spec: SweepSpec, composer: Composer | None = None) -> list[RunSpec]:
    """Every run of a grid sweep, in a stable order (grid, then variants, then seeds)."""
    composer = composer or Composer(spec)
    axes = list(spec.grid.items())
    points = list(itertools.product(*[[(k, i, v) for i, v in enumerate(vals)] for k, vals in axes])) or [()]
    variants: list[tuple[str | None, dict[str, Any]]] = [*spec.variants.items()] or [(None, {})]
    short = _short_names([k for k, _ in axes])
    groups = set(config_groups())
    runs: list[RunSpec] = []
    seen: dict[str, str] = {}  # run id -> label
    for point in points:
        for vname, bundle in variants:
            assigned = [(k, v, f"grid.{k}[{i}]") for k, i, v in point]
            assigned += [(k, v, f"variants.{vname}.{k}") for k, v in bundle.items()]
            delta = ([vname] if vname else []) + [composer.delta(short[k], v, groups) for k, _, v in point]
            for seed in spec.seeds:
                label = " ".join(delta + [f"seed={seed}"])
                run = composer.run(assigned, seed=seed, label=label, variant=vname)
                if run.id in seen:
                    raise SweepError(
                        f"{spec.where()}: runs '{seen[run.id]}' and '{label}' resolve to the same "
                        f"config (run id {run.id}); drop one"
                    )
                seen[run.id] = label
                runs.append(run)
    for run in _control_runs(spec):
        if run.id in seen:
            raise SweepError(
                f"{spec.where()}: control '{run.label}' resolves to the same config as run '{seen[run.id]}' "
                f"(run id {run.id}); drop one"
            )
        seen[run.id] = run.label
        runs.append(run)
    if spec.reading:
        resolve_from_records(runs, spec.folder)
    return runs


def _control_runs(spec: SweepSpec) -> list[RunSpec]:
    """The runs of `controls:` (stare_lab.core.controls), one per seed each, from the sweep's base settings:
    no grid axis or variant applies, nor the base's rule params (a control sets its own rule)."""
    if not spec.controls:
        return []
    plain = dataclasses.replace(spec, overrides={k: v for k, v in spec.overrides.items() if not k.startswith("method")})
    composer = Composer(plain)
    runs = []
    for i, name in enumerate(spec.controls):
        assigned = [(k, v, f"controls[{i}]") for k, v in control_overrides(name)]
        for seed in spec.seeds:
            variant = None if name == BASE else name  # base is its own method; random_reward a variant of the baseline
            runs.append(composer.run(assigned, seed=seed, label=f"{name} seed={seed}", variant=variant))
    return runs


def _short_names(keys: list[str]) -> dict[str, str]:
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (leaf if leaves.count(leaf) == 1 else k) for k, leaf in zip(keys, leaves, strict=True)}


def _delta(short: str, v: Any, groups: set[str]) -> str:
    return str(v) if short in groups else f"{short}={fmt_value(v)}"


def verify_run(run: RunSpec) -> None:
    """Compare a fast-expanded run with the real `compose(run.overrides)`; raise on any difference.
    `run.imports` is the sweep's, not the config's (stare_lab.methods.outside): it is left out."""
    exact = _mapping(compose(run.overrides), resolve=True)
    config = {**run.config, "run": {k: v for k, v in run.config["run"].items() if k != "imports"}}
    if exact != config:
        diff = sorted(k for k in set(exact) | set(config) if exact.get(k) != config.get(k))
        raise RuntimeError(
            f"sweep expansion differs from compose() for run {run.label!r} in {diff}; report this as a stare_lab bug"
        )


class Composer:
    """Resolves runs of one sweep, caching each group combination and each converted value."""

    def __init__(self, spec: SweepSpec):
        self.spec = spec
        self._combos: dict[tuple, dict] = {}
        self._values: dict[tuple, Any] = {}
        self._params: dict[tuple[str, Any], dict] = {}  # (rule and params, TrainerValues) -> filled params
        self._strings: dict[tuple[str, ...], str] = {}
        self._schema_nodes: dict[str, Any] = {}
        self._base: dict | None = None
        self._sections: dict[tuple[str, str], dict | None] = {}
        self._checked: set[tuple[str, ...]] = set()
        self.base = [
            (k, v, "base.overrides." + k if not k.startswith("eval.") else k) for k, v in spec.overrides.items()
        ]

    def run(self, assigned: list[tuple[str, Any, str]], *, seed: int, label: str, variant: str | None) -> RunSpec:
        spec = self.spec
        groups = dict(spec.groups)
        dotted: list[tuple[str, Any, str]] = []
        origins = {}
        for k, v, origin in self.base + assigned:
            (groups.__setitem__(k, v) if "." not in k else dotted.append((k, v, origin)))
            origins[k] = origin
        cfg = self._resolve(groups, dotted, origins, label)
        run_block = {
            "root": str(spec.output),
            "sweep": spec.name,
            "label": label,
            "variant": variant,
            "processes": self.training_processes(cfg["trainer"], origins, label),
        }
        overrides = [self._override(g, c) for g, c in groups.items()]
        overrides += [self._override(k, v) for k, v, _ in dotted]
        signature = tuple(overrides)  # the run's config but for its seed and run block
        overrides += [f"seed={seed}"] + [self._override(f"run.{k}", v) for k, v in run_block.items() if k != "label"]
        overrides.append(f"run.label={fmt_value(label)}")
        cfg["seed"] = seed
        cfg["run"] = {**run_block, "id": None}
        if spec.imported:  # how its worker finds the rules kept outside the package (not an override)
            cfg["run"]["imports"] = run_entries(spec.imported)
        resolved = self._rule_known(cfg["method"]["name"])
        finalize(cfg, rule_known=resolved)
        if signature not in self._checked:  # seeds are checked by the schema (schema._seeds)
            self._check(cfg, origins, label)
            self._checked.add(signature)
        run_id = cfg["run"]["id"]
        return RunSpec(
            overrides=overrides,
            config=cfg,
            id=run_id,
            label=label,
            variant=variant,
            seed=seed,
            run_dir=spec.folder / run_id,
            resolved=resolved,
        )

    def _rule_known(self, name: str) -> bool:
        """Whether the registry knows the rule; always, but in a reading command (`SweepSpec.reading`)."""
        if not self.spec.reading:
            return True
        return is_registered(name) or name == BASE

    def training_processes(self, trainer: dict, origins: dict[str, str], label: str) -> int:
        """The run's world size: the launcher's tasks, less those its vLLM server keeps (config/server_layout.py)."""
        la = self.spec.launcher
        nodes = la.nodes_per_run
        try:
            layout = server_layout(trainer, nodes, la.processes_per_run, la.gpus_per_run // nodes)
        except ValueError as e:
            msg = str(e)
            key = msg.split(":", 1)[0]
            origin = origins.get(key)
            msg = origin + msg[len(key) :] if origin and key in origin else msg
            raise SweepError(f"{self.spec.where()}: {msg} (run '{label}')") from None
        return layout.training_processes if layout else la.processes_per_run

    def _check(self, cfg: dict, origins: dict[str, str], label: str) -> None:
        """`check_values` on a run, its error named by where the sweep set the bad key."""
        try:
            check_values(cfg, rule=False)
        except ConfigError as e:
            msg = str(e)
            key = msg.split(":", 1)[0]
            origin = origins.get(key) or origins.get(key.split("[")[0])
            if origin and key in origin:  # base.overrides.trainer.max_steps: must be ≥ 1, ...
                msg = origin + msg[len(key) :]
            elif origin and not key.startswith(origin):
                msg = f"{origin}: {msg}"
            raise SweepError(f"{self.spec.where()}: {msg} (run '{label}')") from None

    def delta(self, short: str, value: Any, groups: set[str]) -> str:
        key = ("delta", short, repr(value))
        if key not in self._strings:
            self._strings[key] = _delta(short, value, groups)
        return self._strings[key]

    def _override(self, key: str, value: Any) -> str:
        cache_key = (key, repr(value))
        if cache_key not in self._strings:
            self._strings[cache_key] = f"{key}={fmt_value(value)}"
        return self._strings[cache_key]

    # -- resolution ---------------------------------------------------------------------------

    def _resolve(self, groups: dict[str, str], dotted, origins: dict[str, str], label: str) -> dict:
        d = dict(self._combo(groups))
        copied: set[str] = set()
        for key, value, origin in dotted:
            section, _, rest = key.partition(".")
            if section not in copied:
                d[section] = dict(d[section]) if isinstance(d.get(section), dict) else {}
                copied.add(section)
            if section == "method" and rest.startswith("params."):
                d["method"]["params"] = {**d["method"].get("params", {}), rest[len("params.") :]: value}
            elif "." in rest:  # a key inside a section that may be null until set (model.lora.r)
                sub, _, leaf = rest.partition(".")
                inner = {**(d[section].get(sub) or {}), leaf: value}
                d[section][sub] = self._convert(f"{section}.{sub}", inner, origin, groups, shown=(key, value))
            else:
                d[section][rest] = self._convert(key, value, origin, groups)
        d["trainer"] = dict(d["trainer"])  # finalize fills it in place; the combo is shared
        d["method"] = dict(d["method"])
        d["method"]["params"] = self._filled_params(d["method"], d["trainer"], origins, label)
        return d

    def _combo(self, groups: dict[str, str]) -> dict:
        """The schema-merged config for these group choices, before any dotted override.

        The defaults are composed once with Hydra; a chosen group's file then replaces its node,
        merged with that section's schema (what Hydra and the Config merge do for plain group
        files; sections merge independently). A file that is not plain goes through Hydra."""
        key = tuple(sorted(groups.items()))
        if key not in self._combos:
            if self._base is None:
                self._base = self._merged(_raw([]), "the defaults")
            combo = dict(self._base)
            for group, choice in groups.items():
                section = self._section(group, choice)
                if section is None:
                    combo = self._merged(_raw([f"{g}={c}" for g, c in groups.items()]), str(dict(groups)))
                    break
                combo[group] = section
            self._combos[key] = combo
        return self._combos[key]

    def _section(self, group: str, choice: str) -> dict | None:
        """A group option's node merged with its section's schema; None when the file is not
        self-contained (it moves to another package or interpolates other sections)."""
        if (group, choice) not in self._sections:
            self._sections[(group, choice)] = self._load_section(group, choice)
        return self._sections[(group, choice)]

    def _load_section(self, group: str, choice: str) -> dict | None:
        if group == "method":  # generated from the registry (config.store_methods)
            return {"name": choice, "params": {}}
        if group not in Config.__dataclass_fields__:
            return None
        text = (CONF_DIR / group / f"{choice}.yaml").read_text()
        package = re.search(r"^#\s*@package\s+(\S+)", text, re.M)
        if (package and package.group(1) != group) or "${" in text:
            return None
        node = OmegaConf.create(text)
        if not isinstance(node, DictConfig):
            raise SweepError(f"{self.spec.where()}: conf/{group}/{choice}.yaml: expected a mapping of keys")
        hint = typing.get_type_hints(Config)[group]
        base = OmegaConf.structured(hint) if dataclasses.is_dataclass(hint) else OmegaConf.create({})
        defaults = node.pop("defaults", None)
        if defaults is not None:  # a base plus differences (conf/trainer/gpu_stare.yaml)
            if list(defaults)[1:] == ["_self_"] and isinstance(defaults[0], str) and "${" not in defaults[0]:
                base = self._section(group, defaults[0])
            else:  # any other defaults list: Hydra composes it
                node = OmegaConf.create(OmegaConf.to_container(hydra_raw([f"{group}={choice}"])[group]))
        if base is None:
            return None
        try:
            merged = OmegaConf.merge(base, node)
        except Exception as e:  # noqa: BLE001 - a broken group file, named
            raise SweepError(f"{self.spec.where()}: conf/{group}/{choice}.yaml: {' '.join(str(e).split())}") from None
        return _mapping(merged, resolve=True)

    def _merged(self, raw: dict, what: str) -> dict:
        try:
            return _mapping(OmegaConf.merge(OmegaConf.structured(Config), raw), resolve=True)
        except Exception as e:  # noqa: BLE001 - reported with the groups that caused it
            raise SweepError(f"{self.spec.where()}: config groups {what}: {' '.join(str(e).split())}") from None

    def _convert(
        self, key: str, value: Any, origin: str, groups: dict[str, str], shown: tuple[str, Any] | None = None
    ) -> Any:
        """The value as the dataclass schema stores it (1 → 1.0 for a float field; a section's
        mapping with its defaults filled). `shown`: the (key, value) the sweep wrote, for the error."""
        cache_key = (key, repr(value), groups.get("task") if key.startswith("task.") else None)
        if cache_key in self._values:
            return self._values[cache_key]
        section, _, leaf = key.partition(".")
        if section == "task" and "." not in leaf and leaf in self._combo(groups)["task"]:
            out = value  # free-form (dict[str, Any]); like compose(), only keys the task file declares
        else:
            try:
                node = self._schema_node(section)
                if "." in leaf or leaf not in node.keys():
                    raise KeyError(leaf)
                inner = section_schema(key)
                if inner is not None and isinstance(value, dict):  # typed and filled by its schema
                    out = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(inner), value))
                else:
                    node[leaf] = value
                    out = _mapping(node)[leaf]
            except Exception:  # noqa: BLE001 - the exact message comes from compose() below
                bad_key, bad_value = shown or (key, value)
                raise SweepError(
                    f"{self.spec.where()}: {origin}: {self._compose_error(bad_key, bad_value, groups)}"
                ) from None
        self._values[cache_key] = out
        return out

    def _schema_node(self, section: str):
        """A schema node of a config section (a dataclass schema, or free-form) that `_convert`
        assigns values to, one at a time, to read them back as the schema stores them."""
        if section not in self._schema_nodes:
            hint = typing.get_type_hints(Config)[section]
            self._schema_nodes[section] = (
                OmegaConf.structured(hint) if dataclasses.is_dataclass(hint) else OmegaConf.create({})
            )
        return self._schema_nodes[section]

    def _compose_error(self, key: str, value: Any, groups: dict[str, str]) -> str:
        try:
            compose([f"{g}={fmt_value(c)}" for g, c in groups.items()] + [f"{key}={fmt_value(value)}"])
        except ConfigError as e:
            return str(e)
        return f"{key}={fmt_value(value)} can not be applied by the sweep expansion (a nested key?)"

    def _filled_params(self, method: dict, trainer: dict, origins: dict[str, str], label: str) -> dict:
        params = method.get("params") or {}
        if not self._rule_known(method["name"]):
            return dict(params)  # as the sweep gives them; the record has the rest (stare_lab.plan.records)
        values = TrainerValues.from_config(trainer)  # all a rule may read of the trainer
        cache_key = (repr((method["name"], sorted(params.items()))), values)
        if cache_key not in self._params:
            try:
                self._params[cache_key] = rule_params(method["name"], params, values)
            except ConfigError as e:
                msg = str(e)
                bad = re.search(r"parameter '([^']+)'", msg)
                origin = origins.get(f"method.params.{bad.group(1)}" if bad else "method") or origins.get(
                    "method", "base"
                )
                raise SweepError(f"{self.spec.where()}: {origin}: {msg} (run '{label}')") from None
        return dict(self._params[cache_key])


def _raw(overrides: list[str]) -> dict:
    return _mapping(hydra_raw(overrides), resolve=False)


def _mapping(node: Any, resolve: bool = False) -> dict[Any, Any]:
    """`OmegaConf.to_container` of a mapping node (omegaconf types its result as any container)."""
    out = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(out, dict):
        raise TypeError(f"expected a mapping node, got {type(out).__name__}")
    return out
