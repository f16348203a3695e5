"""Config: Hydra compose API over `conf/`, dataclass schemas, and the resolved run config.

The dataclass schemas (stare_lab.config.schema) hold types and the ranges a value must meet,
never a value: every value lives once, in a YAML file of `conf/` (with a comment above it).
`compose(overrides)` returns a fully resolved DictConfig: the schema catches unknown keys and
wrong types, the rule's Params fill in `method.params` (so a changed default is a new run id),
`finalize` fills the derived defaults and `run.id` (a hash of everything but the `run` block),
and `check_values` refuses any value the trainer, TRL or evaluation would reject later. The
`method` group has no files: it is generated from the rule registry. Errors are `ConfigError`
with one line naming the bad key, option or value.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import math
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from stare_lab.config.schema import (  # noqa: F401  (the schemas, importable from here)
    TASK_SCHEMAS,
    Config,
    EvalConfig,
    LoggerConfig,
    LoraConfig,
    MethodConfig,
    ModelConfig,
    RunConfig,
    TrainerConfig,
    field_checkers,
    field_problem,
    schema_fields,
)
from stare_lab.core.controls import BASE
from stare_lab.core.utils import atomic_write_text, plain_dict
from stare_lab.methods import TrainerValues, get_method, list_methods, method_iterations
from stare_lab.methods.registry import OUTSIDE_HINT
from stare_lab.tasks.reasoning_gym_specs import benchmark_problem

# Everything the package reads at run time lives inside it (a wheel works from any directory).
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # stare_lab/ (this file is stare_lab/config/run_config.py)
CONF_DIR = PACKAGE_DIR / "conf"
SWEEP_DIR = PACKAGE_DIR / "sweeps"
# Offline copies of AIME 2024/2025, AMC 2023 and MATH-500 (<name>.jsonl) with their licence notes.
BENCHMARK_DATA_DIR = PACKAGE_DIR / "data" / "benchmarks"


class ConfigError(ValueError):
    """A user mistake in a config or override: the message is one line naming it."""


# ---------------------------------------------------------------------------- config groups
def group_names() -> list[str]:
    """The config groups: folders of `conf/` with YAML files, and `method` (from the registry)."""
    return sorted({p.name for p in CONF_DIR.iterdir() if p.is_dir() and any(p.glob("*.yaml"))} | {"method"})


def group_options(group: str) -> list[str]:
    if group == "method":
        return sorted([*list_methods(), BASE])
    return list(_file_options(CONF_DIR, group))


@functools.cache
def _file_options(conf_dir: Path, group: str) -> tuple[str, ...]:
    """The YAML files of a group (read once per process: the package's configs do not change)."""
    return tuple(sorted(p.stem for p in (conf_dir / group).glob("*.yaml")))


def store_methods() -> None:
    """The `method` config group: one ConfigStore node per registered rule (its params come
    from the rule's Params dataclass in `resolve`)."""
    store = ConfigStore.instance()
    for name in [*list_methods(), BASE]:
        store.store(group="method", name=name, node={"name": name, "params": {}})


def hydra_raw(overrides: list[str]) -> DictConfig:
    """`conf/config.yaml` composed by Hydra with these overrides, before the schema."""
    store_methods()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=overrides)


# ------------------------------------------------------------------------------ resolution
def compose(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose `conf/config.yaml` with Hydra overrides and resolve it (see module docstring)."""
    # Rule params are free-form in YAML (the rule's dataclass is their schema): let
    # `method.params.rho=0.3` add a key without Hydra's `+` prefix; `model.lora.r=8` sets a key of a
    # section that is null until LoRA is asked for (the schema, LoraConfig, then checks the keys).
    overrides = ["++" + o if o.startswith(("method.params.", "model.lora.")) else o for o in overrides]
    _check_group_choices(overrides)
    try:
        raw = hydra_raw(overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_one_line(e)) from None
    return resolve(raw)


def resolve(raw: DictConfig | dict) -> DictConfig:
    """Validate against the schema, fill the rule's params, the derived defaults and the run id,
    and check every value (`check_values`)."""
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), raw)
    except OmegaConfBaseException as e:
        raise ConfigError(_one_line(e)) from None
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"missing value for {', '.join(missing)} (set it, e.g. {missing[0]}=...)")
    check_values(plain_dict(cfg), rule=False)
    cfg.method.params = rule_params(cfg.method.name, plain_dict(cfg.method.params), cfg.trainer)
    return finalize(cfg)


def rule_params(name: str, params: dict[str, Any], trainer: Any) -> dict[str, Any]:
    """The rule's full params (its Params defaults filled in) as plain data, after checking them
    and their agreement with the trainer's values (`trainer`: the trainer block, or the
    `TrainerValues` read from it). A rule's ValueError becomes a ConfigError. `base` (the untrained
    model, stare_lab.core.controls) is no rule: it has no params and ignores any given."""
    if name == BASE:
        return {}
    try:
        rule = get_method(name, **params)
        rule.check_trainer(trainer if isinstance(trainer, TrainerValues) else TrainerValues.from_config(trainer))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return _jsonable(dataclasses.asdict(rule.params))


def finalize(cfg: Any, rule_known: bool = True) -> Any:
    """Fill the derived defaults and `run.id` of a resolved config (DictConfig or plain dict, in
    place). The one place they are computed: `compose` and the sweep expansion both call it.
    `rule_known=False` (a reading command's run of a rule it has not imported): the rule's values
    stay unfilled, and the id is provisional (stare_lab.plan.records takes the recorded one)."""
    trainer = cfg["trainer"]
    if cfg["method"]["name"] == BASE:  # the untrained model: no step, whatever the trainer block says
        trainer["max_steps"] = 0
    if trainer["steps_per_generation"] is None:  # TRL's default: one rollout batch per optimizer step
        trainer["steps_per_generation"] = trainer["gradient_accumulation_steps"]
    if trainer["num_iterations"] is None and rule_known:  # the rule's passes over each generation batch (Lopti: 2)
        name = cfg["method"]["name"]
        trainer["num_iterations"] = 1 if name == BASE else method_iterations(name)
    if cfg["run"]["id"] is None:
        cfg["run"]["id"] = run_id(cfg)
    return cfg


# Trainer keys that never change what a run computes with one process (hashed only with several).
MULTIPROCESS_KEYS = ("distributed", "ddp_timeout_s")
VLLM_KEYS = tuple(k for k in TrainerConfig.__dataclass_fields__ if k.startswith("vllm_"))
MICROBATCH_KEYS = tuple(k for k in TrainerConfig.__dataclass_fields__ if k.startswith("microbatch_"))
# Where a run's server sits (stare_lab.config.server_layout): hashed only in server mode, so that colocated runs keep
# the ids they had before these keys existed (the world size they leave to training is hashed as `processes`).
SERVER_LAYOUT_KEYS = ("vllm_server_gpus", "vllm_server_node")


def run_id(cfg: Any) -> str:
    """Hash of the resolved config without the `run` block (where and how it is named). A run of
    several processes also hashes its world size and engine (the global batch is per-device batch
    × processes); a one-process run hashes neither, so its id is what it was before they existed.
    Likewise the `trainer.vllm_*` keys count only with `use_vllm`, the `trainer.microbatch_*` keys only
    for a rule with `scope: microbatch`, `trainer.delta` only when set, and `eval.engine` only when it is
    not transformers, and `task.reward`/`reward_p` only when the reward is not the verifier's: a run that
    uses none of them keeps the id it had before they could be set."""
    data = plain_dict(cfg)
    body = {k: v for k, v in data.items() if k != "run"}
    processes = int((data.get("run") or {}).get("processes") or 1)
    unused = MULTIPROCESS_KEYS + (() if body["trainer"].get("use_vllm") else VLLM_KEYS)
    if body["trainer"].get("vllm_mode") != "server":
        unused += SERVER_LAYOUT_KEYS
    if ((body.get("method") or {}).get("params") or {}).get("scope") != "microbatch":
        unused += MICROBATCH_KEYS
    if body["trainer"].get("delta") is None:  # TRL's two-sided clipping off: the id it had before the key
        unused += ("delta",)
    trainer = {k: v for k, v in body["trainer"].items() if k not in unused}
    if processes > 1:
        body["processes"], trainer["distributed"] = processes, body["trainer"].get("distributed", "ddp")
    body["trainer"] = trainer
    if body.get("eval", {}).get("engine", "transformers") == "transformers":
        body["eval"] = {k: v for k, v in body["eval"].items() if k != "engine"}
    task = body.get("task") or {}
    if task.get("reward", "verifier") == "verifier":  # the verifier's reward: the id it had before the keys
        body["task"] = {k: v for k, v in task.items() if k not in ("reward", "reward_p")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:12]


def check_values(cfg: Mapping[str, Any], *, rule: bool = True) -> None:
    """Every value of a resolved config (plain data) against its schema field's type and range,
    and the combinations TRL or evaluation would refuse later. ConfigError naming the key."""
    _check_section(Config, cfg, "")
    _check_task(cfg["task"])
    if cfg["task"].get("name") == "reasoning_gym" and cfg["model"]["name_or_path"] == "builtin":
        raise ConfigError(
            "model.name_or_path: the built-in model reads 64 tokens and Reasoning Gym's prompts are hundreds; "
            "train task=reasoning_gym on a real model (model=qwen2_5_1_5b, or a path)"
        )
    t = cfg["trainer"]
    processes = int(cfg["run"].get("processes") or 1)
    per_generation = t["steps_per_generation"] or t["gradient_accumulation_steps"]
    batch = t["per_device_train_batch_size"] * per_generation * processes
    if batch % t["num_generations"]:
        over = " × processes" if processes > 1 else ""
        by = f" × {processes}" if processes > 1 else ""
        raise ConfigError(
            f"trainer.num_generations: the generation batch (per_device_train_batch_size × steps_per_generation{over} "
            f"= {t['per_device_train_batch_size']} × {per_generation}{by} = {batch}) is not divisible by "
            f"num_generations = {t['num_generations']}: TRL needs whole groups of completions per prompt"
        )
    engine = t.get("distributed", "ddp")
    check_engine(engine)
    if processes > 1 and engine != "ddp" and t["use_cpu"]:
        # accelerate applies its FSDP and DeepSpeed plugins to GPU processes only: on CPU it would
        # silently run DDP under the engine's name
        raise ConfigError(
            f"trainer.distributed: {engine} shards over GPUs only (accelerate runs CPU processes "
            "with DDP); use ddp with trainer.use_cpu=true, or GPUs (trainer.use_cpu=false)"
        )
    check_benchmarks(cfg["eval"]["benchmarks"], cfg["task"].get("name"))
    if rule:
        rule_params(cfg["method"]["name"], cfg["method"]["params"], t)


def check_engine(engine: str) -> None:
    """The engine of `trainer.distributed` can be used here, or one line saying what to install."""
    if engine.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(
            f"trainer.distributed: {engine} needs DeepSpeed, which is not installed here: "
            "pip install 'stare-lab[deepspeed]' (or choose ddp or fsdp)"
        )
    if engine == "fsdp" and importlib.util.find_spec("torch") is not None:
        import torch  # deferred: torch, only for an fsdp run

        if not torch.distributed.is_available() or importlib.util.find_spec("torch.distributed.fsdp") is None:
            raise ConfigError(
                "trainer.distributed: fsdp needs a torch build with torch.distributed (FSDP), "
                "which this one lacks; choose ddp or install such a torch"
            )


def _check_section(schema: type, data: Mapping[str, Any], prefix: str) -> None:
    for name, section, check in _check_plan(schema):
        if section is not None:
            if data[name] is not None:  # an optional section (model.lora) may be null
                _check_section(section, data[name], f"{prefix}{name}.")
            continue
        problem = check(data[name])
        if problem:
            raise ConfigError(f"{prefix}{name}: {problem}")


def check_benchmarks(names: list[str], task_name: str | None) -> None:
    """Each name is a benchmark of conf/benchmark/, the run's own task (its held-out split), or a
    Reasoning Gym dataset `rg:<name>`."""
    known = set(group_options("benchmark")) | ({task_name} if task_name else set())
    for i, name in enumerate(names):
        if str(name).startswith("rg:"):  # a Reasoning Gym dataset (docs/tasks.md)
            problem = benchmark_problem(str(name))
            if problem:
                raise ConfigError(f"eval.benchmarks[{i}]: {problem}")
            continue
        if name == "reasoning_gym" and task_name != name:
            raise ConfigError(
                f"eval.benchmarks[{i}]: 'reasoning_gym' is the held-out set of a reasoning_gym task; "
                "name its datasets instead (rg:<dataset>)"
            )
        if name not in known:
            raise ConfigError(f"eval.benchmarks[{i}]: unknown benchmark {name!r}; valid: {', '.join(sorted(known))}")


def _check_task(task: Mapping[str, Any]) -> None:
    schema = TASK_SCHEMAS.get(str(task.get("name")))
    if schema is None:
        raise ConfigError(f"task.name: unknown task {task.get('name')!r}; valid: {', '.join(TASK_SCHEMAS)}")
    checkers = field_checkers(schema)
    for key, value in task.items():
        if key not in checkers:
            raise ConfigError(f"task.{key}: unknown key for task {task['name']!r}; valid keys: {', '.join(checkers)}")
        problem = checkers[key](value)
        if problem:
            raise ConfigError(f"task.{key}: {problem}")


@functools.cache
def _check_plan(schema: type) -> tuple[tuple[str, type | None, Any], ...]:
    checkers = field_checkers(schema)
    return tuple((name, _section(hint), checkers[name]) for name, (hint, _) in schema_fields(schema).items())


def _section(hint: Any) -> type | None:
    """The schema dataclass of a section field (`X` or `X | None`), else None."""
    options = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    found = options[0] if len(options) == 1 else None
    return found if isinstance(found, type) and dataclasses.is_dataclass(found) else None


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, float) and math.isinf(v):
            v = "inf" if v > 0 else "-inf"
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    return out


def _check_group_choices(overrides: list[str]) -> None:
    """`method=nope` → one line listing the valid options of that config group."""
    groups = group_names()
    for o in overrides:
        key, sep, value = o.partition("=")
        key = key.lstrip("+~")
        if sep and "." not in key and key in groups and value not in group_options(key):
            hint = ""
            if key == "method":
                hint = f"; {OUTSIDE_HINT}"
            raise ConfigError(f"unknown {key} option {value!r}; valid: {', '.join(group_options(key))}{hint}")


def _one_line(e: Exception) -> str:
    msg = " ".join(str(e).split())
    m = re.search(r"Could not override '([^']+)'", msg)
    if m:
        return _unknown_key(m.group(1))
    m = re.search(r"Key '([^']+)' not in '(\w+)'.*?full_key: (\S+)", msg)
    if m:
        return _unknown_key(m.group(3))
    m = re.search(r"Invalid type assigned: (\w+) is not a subclass of (\w+)\. value: (.*?) full_key: (\S+)", msg)
    if m and m.group(2) in SECTIONS:
        keys = ", ".join(sorted(schema_fields(SECTIONS[m.group(2)])))
        return f"{m.group(4)}: expected null or a mapping of {keys}, got {m.group(3)!r} ({m.group(1)})"
    m = re.search(r"full_key: (\S+)", msg)
    if m:
        return f"{m.group(1)}: {msg.split(' full_key:')[0]}"
    return msg


def section_schema(key: str) -> type | None:
    """The schema dataclass a dotted key names (`model.lora` → LoraConfig), else None: a sweep may
    give such a key a mapping (or null) as its value."""
    node: Any = Config
    for part in key.split("."):
        hint = schema_fields(node).get(part, (None,))[0]
        node = _section(hint) if hint is not None else None
        if node is None:
            return None
    return node


SECTIONS = {"LoraConfig": LoraConfig}  # optional sections: a wrong value is named with the section's keys


def _unknown_key(full_key: str) -> str:
    parent, _, leaf = full_key.rpartition(".")
    node: Any = Config  # the schema's sections, optional ones (model.lora) included
    for part in parent.split(".") if parent else []:
        hint = schema_fields(node).get(part, (None,))[0] if node is not None else None
        node = _section(hint) if hint is not None else None
    valid = sorted(schema_fields(node)) if node is not None else []
    return f"unknown config key {full_key!r}" + (
        f"; valid keys under {parent or 'the root'}: {', '.join(valid)}" if valid else ""
    )


def packaged_sweeps() -> list[str]:
    return sorted(p.stem for p in SWEEP_DIR.glob("*.yaml"))


def sweep_path(name_or_path: str | Path) -> Path:
    """A sweep file: a path as given (relative to the current directory), or the name of a sweep
    shipped in the package (`demo` → stare_lab/sweeps/demo.yaml). A name that is neither is
    returned as a path, for the caller's "no such sweep file"."""
    path = Path(name_or_path).expanduser()
    if path.exists() or path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        return path
    packaged = SWEEP_DIR / f"{path.name}.yaml"
    return packaged if packaged.is_file() else path


def save_config(cfg: DictConfig, path: Path) -> None:
    atomic_write_text(path, OmegaConf.to_yaml(cfg, resolve=True))


def load_config(path: Path) -> DictConfig:
    if not Path(path).is_file():
        raise ConfigError(f"no config file at {path}")
    cfg = OmegaConf.load(path)
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: a run's config is a mapping of sections, not a list")
    return cfg
