"""Config: Hydra compose API over `conf/`, dataclass schemas, and the resolved run config.

`compose(overrides)` returns a fully resolved DictConfig: the dataclass schema catches unknown
keys and wrong types, the rule's Params fill in `method.params` (so a changed default is a new
run id), and `run.id` is a hash of everything but the `run` block. Errors are `ConfigError`
with one line naming the bad key, option or value.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


class ConfigError(ValueError):
    """A user mistake in a config or override: the message is one line naming it."""


@dataclass
class ModelConfig:
    name_or_path: str = "builtin"
    dtype: str = "float32"
    attn_implementation: Any = None
    lora: Any = None                 # null or {r, alpha, dropout, target_modules}


@dataclass
class MethodConfig:
    name: str = "full"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainerConfig:
    max_steps: int = 20
    learning_rate: float = 3e-4
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    num_generations: int = 8
    per_device_train_batch_size: int = 16
    gradient_accumulation_steps: int = 2
    steps_per_generation: Any = None
    num_iterations: int = 1
    max_completion_length: int = 24
    temperature: float = 1.0
    top_p: float = 1.0
    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    scale_rewards: str = "group"
    save_steps: int = 10
    save_total_limit: int = 2
    logging_steps: int = 1
    grad_geometry_every: int = 0
    stats_chunk_tokens: int = 1024
    attn_chunk_queries: int = 128
    js_chunk_positions: int = 64
    use_cpu: bool = True
    bf16: bool = False
    gradient_checkpointing: bool = False
    use_vllm: bool = False
    generation_kwargs: dict[str, Any] = field(default_factory=dict)  # extra GenerationConfig keys for rollouts


@dataclass
class LoggerConfig:
    wandb: bool = True
    project: str = "stare_lab"
    entity: Any = None
    mode: str = "auto"


@dataclass
class EvalConfig:
    benchmarks: list[str] = field(default_factory=lambda: ["arithmetic"])
    n: int = 32
    temperature: float = 1.0
    top_p: float = 0.7
    max_tokens: Any = None
    batch_size: int = 64
    every_steps: int = 0
    enabled: bool = True


@dataclass
class RunConfig:
    root: str = "runs"
    sweep: str = "train"
    id: Any = None
    label: Any = None
    variant: Any = None


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: dict[str, Any] = field(default_factory=lambda: {"name": "arithmetic"})
    method: MethodConfig = field(default_factory=MethodConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0
    run: RunConfig = field(default_factory=RunConfig)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose `conf/config.yaml` with Hydra overrides and resolve it (see module docstring)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    # Rule params are free-form in YAML (the rule's dataclass is their schema): let
    # `method.params.rho=0.3` add a key without Hydra's `+` prefix.
    overrides = ["++" + o if o.startswith("method.params.") else o for o in overrides]
    _check_group_choices(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            raw = hydra_compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_one_line(e)) from None
    return resolve(raw)


def resolve(raw: DictConfig | dict) -> DictConfig:
    """Validate against the schema, fill the rule's params, and compute run id and label."""
    from omegaconf.errors import OmegaConfBaseException

    from stare_lab.methods import get_method

    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), raw)
    except OmegaConfBaseException as e:
        raise ConfigError(_one_line(e)) from None
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"missing value for {', '.join(missing)} (set it, e.g. {missing[0]}=...)")
    params = OmegaConf.to_container(cfg.method.params, resolve=True)
    try:
        rule = get_method(cfg.method.name, **params)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    cfg.method.params = _jsonable(dataclasses.asdict(rule.params))
    if cfg.trainer.steps_per_generation is None:
        cfg.trainer.steps_per_generation = cfg.trainer.gradient_accumulation_steps
    if cfg.run.id is None:
        cfg.run.id = run_id(cfg)
    return cfg


def run_id(cfg: DictConfig) -> str:
    """Hash of the resolved config without the `run` block (where and how it is named)."""
    body = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "run"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:12]


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
    for o in overrides:
        key, sep, value = o.partition("=")
        key = key.lstrip("+~")
        if sep and "." not in key and (CONF_DIR / key).is_dir() and value not in group_options(key):
            raise ConfigError(f"unknown {key} option {value!r}; valid: {', '.join(group_options(key))}")


def _one_line(e: Exception) -> str:
    msg = " ".join(str(e).split())
    m = re.search(r"Could not override '([^']+)'", msg)
    if m:
        return _unknown_key(m.group(1))
    m = re.search(r"Key '([^']+)' not in '(\w+)'.*?full_key: (\S+)", msg)
    if m:
        return _unknown_key(m.group(3))
    m = re.search(r"full_key: (\S+)", msg)
    if m:
        return f"{m.group(1)}: {msg.split(' full_key:')[0]}"
    return msg


def _unknown_key(full_key: str) -> str:
    parent, _, leaf = full_key.rpartition(".")
    node: Any = OmegaConf.structured(Config)
    for part in parent.split(".") if parent else []:
        node = node.get(part) if isinstance(node, DictConfig) else None
    valid = sorted(node.keys()) if isinstance(node, DictConfig) else []
    return f"unknown config key {full_key!r}" + (f"; valid keys under {parent or 'the root'}: {', '.join(valid)}" if valid else "")


def save_config(cfg: DictConfig, path: Path) -> None:
    from stare_lab.utils import atomic_write_text

    atomic_write_text(path, OmegaConf.to_yaml(cfg, resolve=True))


def load_config(path: Path) -> DictConfig:
    if not Path(path).is_file():
        raise ConfigError(f"no config file at {path}")
    return OmegaConf.load(path)
