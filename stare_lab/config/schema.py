"""The config schemas: dataclasses that hold types and the ranges or choices a value must meet,
never a value (every value lives once, in a YAML file of `conf/`, with a comment above it).

`field_problem` checks one value against its field; `stare_lab.config.run_config.check_values` walks a
resolved run config with it, and the sweep schema checks launcher and eval blocks with it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from stare_lab.methods.loss_types import AGGREGATIONS, LOSS_TYPES, RANKS
from stare_lab.models.lora import LoraConfig  # the LoRA section lives with the models that apply it
from stare_lab.tasks.reasoning_gym_specs import datasets_problem  # the library itself only when checked


def bounded(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Any = None,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A schema field without a value (YAML holds it) and the range or choices its value must meet.
    `choices` is a tuple or a function returning one (read lazily, when a value is checked);
    `check`: value → problem or None, run after the others (e.g. vLLM is installed for use_vllm)."""
    rules = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, choices=choices, check=check).items() if v is not None}
    return field(default=MISSING, metadata=rules)


# Where the `vllm` extra's environment comes from (one line, exit 2, before anything launches).
VLLM_HINT = (
    "vLLM is not installed in this environment: build its own with `make vllm-env` (the `vllm` extra, "
    "pinned in requirements-vllm.txt; docs/vllm.md) and run with .venv-vllm/bin/stare-lab"
)


def missing_vllm() -> str | None:
    """None when vLLM can be imported here, else the one line that says how to get it. A folder named
    `vllm` on sys.path is a namespace package, not vLLM: only a module with a file counts."""
    spec = importlib.util.find_spec("vllm")
    return None if spec is not None and spec.origin is not None else VLLM_HINT


def _vllm_installed(use_vllm: Any) -> str | None:
    """use_vllm=true needs vLLM in this environment: one line naming the extra (docs/vllm.md)."""
    return missing_vllm() if use_vllm is True else None


# TRL 1.16's GRPOConfig.vllm_importance_sampling_mode values (GRPOTrainer._generate_and_score_completions)
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


# transformers' SchedulerType values (a test keeps them equal) without the two that need an
# evaluation strategy, which the GRPO trainer does not run; importing transformers here would
# cost seconds before every sweep.
LR_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
)


# ------------------------------------------------------------------------------- the schemas
@dataclass
class ModelConfig:
    name_or_path: str = MISSING
    dtype: str = bounded(choices=("float32", "bfloat16", "float16"))
    attn_implementation: str | None = MISSING
    lora: LoraConfig | None = MISSING


@dataclass
class MethodConfig:
    name: str = MISSING
    params: dict[str, Any] = MISSING  # the rule's Params dataclass is their schema


@dataclass
class TrainerConfig:
    max_steps: int = bounded(ge=0)  # 0: the untrained model, evaluated (stare_lab.core.controls)
    learning_rate: float = bounded(ge=0)
    lr_scheduler_type: str = bounded(choices=LR_SCHEDULERS)
    warmup_steps: int = bounded(ge=0)
    weight_decay: float = bounded(ge=0)
    max_grad_norm: float = bounded(ge=0)
    num_generations: int = bounded(ge=2)  # TRL: GRPO needs ≥ 2 completions per prompt
    per_device_train_batch_size: int = bounded(ge=1)
    gradient_accumulation_steps: int = bounded(ge=1)
    steps_per_generation: int | None = bounded(ge=1)
    num_iterations: int | None = bounded(ge=1)  # None: the rule's (`register(iterations=...)`, else 1)
    max_completion_length: int = bounded(ge=1)
    temperature: float = bounded(gt=0)  # rollouts are sampled
    top_p: float = bounded(gt=0, le=1)
    loss_type: str = bounded(choices=LOSS_TYPES)
    beta: float = bounded(ge=0)
    epsilon: float = bounded(ge=0)
    epsilon_high: float = bounded(ge=0)
    delta: float | None = bounded(gt=1)  # TRL's two-sided clipping (verl's dual clip c); null: off
    scale_rewards: str = bounded(choices=("group", "batch", "none"))
    save_steps: int = bounded(ge=1)
    save_total_limit: int = bounded(ge=1)
    logging_steps: int = bounded(ge=1)
    grad_geometry_every: int = bounded(ge=0)
    keep_batches_every: int = bounded(ge=0)  # 0: off
    stats_chunk_tokens: int = bounded(ge=1)
    attn_chunk_queries: int = bounded(ge=1)
    js_chunk_positions: int = bounded(ge=1)
    microbatch_aggregation: str = bounded(choices=AGGREGATIONS)  # scope microbatch only
    microbatch_ranks: str = bounded(choices=RANKS)  # scope microbatch only
    use_cpu: bool = MISSING
    bf16: bool = MISSING
    gradient_checkpointing: bool = MISSING
    use_vllm: bool = bounded(check=_vllm_installed)
    # vLLM (docs/vllm.md): read only when use_vllm; names follow TRL's GRPOConfig
    vllm_mode: str = bounded(choices=("colocate", "server"))
    vllm_gpu_memory_utilization: float = bounded(gt=0, le=1)
    vllm_tensor_parallel_size: int = bounded(ge=1)
    vllm_dtype: str | None = bounded(choices=("float32", "bfloat16", "float16"))  # null: the policy's dtype
    vllm_importance_sampling_correction: bool = MISSING
    vllm_importance_sampling_mode: str = bounded(choices=VLLM_IS_MODES)
    vllm_server_host: str = MISSING
    vllm_server_port: int | None = bounded(ge=1, le=65535)  # null: a free port chosen per run
    vllm_server_timeout: float = bounded(gt=0)
    vllm_server_gpus: int = bounded(ge=1)  # server: GPUs (CPU: task slots) of the last node for the server
    vllm_server_node: bool = MISSING  # server: the whole last node for the server
    generation_kwargs: dict[str, Any] = MISSING
    distributed: str = bounded(choices=("ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3"))
    ddp_timeout_s: int = bounded(ge=10)  # a hung collective fails the run after this


@dataclass
class LoggerConfig:
    wandb: bool = MISSING
    project: str = MISSING
    entity: str | None = MISSING
    mode: str = bounded(choices=("auto", "offline", "online", "disabled"))


@dataclass
class EvalConfig:
    benchmarks: list[str] = MISSING  # names of conf/benchmark/, or the run's own task
    # n, temperature, top_p, max_tokens: null = the benchmark's own setting (conf/benchmark/<name>.yaml)
    n: int | None = bounded(ge=1)
    temperature: float | None = bounded(ge=0)  # 0: greedy
    top_p: float | None = bounded(gt=0, le=1)
    max_tokens: int | None = bounded(ge=1)
    batch_size: int = bounded(ge=1)
    every_steps: int = bounded(ge=0)
    enabled: bool = MISSING
    # transformers | vllm: the final evaluation's sampler (intermediate ones sample with the training model)
    engine: str = bounded(choices=("transformers", "vllm"), check=lambda e: _vllm_installed(e == "vllm"))


@dataclass
class RunConfig:
    root: str = MISSING
    sweep: str = MISSING
    id: str | None = MISSING
    label: str | None = MISSING
    variant: str | None = MISSING
    processes: int = bounded(ge=1)  # world size, from the launcher (docs/distributed.md)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: dict[str, Any] = MISSING  # free-form: the task's builder checks its keys
    method: MethodConfig = field(default_factory=MethodConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = bounded(ge=0, lt=2**32)  # numpy and torch seeds are 32-bit
    run: RunConfig = field(default_factory=RunConfig)


@dataclass
class ArithmeticTaskConfig:
    name: str = MISSING
    train_size: int = bounded(ge=1)
    heldout_size: int = bounded(ge=1)
    seed: int = bounded(ge=0, lt=2**32)
    reward: str = bounded(choices=("verifier", "random"))
    reward_p: float = bounded(gt=0, lt=1)


@dataclass
class MathTaskConfig:
    name: str = MISSING
    train_source: str | None = MISSING
    heldout_source: str | None = MISSING
    train_split: str = MISSING
    heldout_split: str = MISSING
    train_subset: str | None = MISSING
    heldout_subset: str | None = MISSING
    fields: Any = MISSING  # {problem, answer, id}: a column name or a list of them
    heldout_fields: Any = MISSING
    train_limit: int | None = bounded(ge=1)
    heldout_limit: int | None = bounded(ge=1)
    template: str = MISSING  # must contain {problem}
    chat: bool = MISSING
    system_prompt: str | None = MISSING
    reward: str = bounded(choices=("verifier", "random", "format"))
    reward_p: float = bounded(gt=0, lt=1)


def _rg_datasets(value: Any) -> str | None:
    """task.datasets of reasoning_gym: names, weights and generator configs, checked by the library itself."""
    return datasets_problem(value)


@dataclass
class ReasoningGymTaskConfig:
    name: str = MISSING
    datasets: list[Any] = bounded(check=_rg_datasets)  # [{name, weight, config}]
    train_size: int = bounded(ge=1)
    heldout_size: int = bounded(ge=1)  # per dataset
    seed: int = bounded(ge=0, lt=2**32)
    heldout_seed: int = bounded(ge=0, lt=2**32)
    template: str = MISSING  # must contain {question}, and {tag} where answer is tag
    answer_tag: str = MISSING
    answer: str = bounded(choices=("tag", "last_number"))
    chat: Any = bounded(choices=(True, False, "auto"))
    system_prompt: str | None = MISSING
    reward: str = bounded(choices=("verifier", "random"))
    reward_p: float = bounded(gt=0, lt=1)


# The `task` section is free-form in `Config` (each task has its own keys); these schemas check
# the keys a task's YAML or an override sets (keys left out take the task's own defaults).
TASK_SCHEMAS: dict[str, type] = {
    "arithmetic": ArithmeticTaskConfig,
    "math": MathTaskConfig,
    "reasoning_gym": ReasoningGymTaskConfig,
}


@functools.cache
def schema_fields(schema: type) -> dict[str, tuple[Any, Mapping[str, Any]]]:
    """{field name: (type, range metadata)} of a schema dataclass."""
    hints = typing.get_type_hints(schema)
    return {f.name: (hints[f.name], f.metadata) for f in dataclasses.fields(schema)}


_KINDS = {bool: (bool,), int: (int,), float: (int, float), str: (str,), list: (list, tuple), dict: (dict, Mapping)}
_KIND_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}
_BOUNDS = (
    ("ge", "≥", lambda v, b: v >= b),
    ("gt", ">", lambda v, b: v > b),
    ("le", "≤", lambda v, b: v <= b),
    ("lt", "<", lambda v, b: v < b),
)


def field_problem(value: Any, hint: Any, rules: Mapping[str, Any]) -> str | None:
    """Why `value` does not fit a schema field of type `hint` with `rules`, or None.
    Numbers are not converted (an int is a valid float)."""
    return _checker(hint, rules)(value)


@functools.cache
def field_checkers(schema: type) -> dict[str, Callable[[Any], str | None]]:
    """{field name: value → problem or None} of a schema dataclass, built once (a sweep checks
    every field of every run)."""
    return {name: _checker(hint, rules) for name, (hint, rules) in schema_fields(schema).items()}


def _checker(hint: Any, rules: Mapping[str, Any]) -> Callable[[Any], str | None]:
    args = typing.get_args(hint)
    nullable = hint is Any or type(None) in args
    if type(None) in args:
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint) or hint
    kinds, numeric = _KINDS.get(origin), origin in (int, float)
    item = typing.get_args(hint)[0] if origin is list and typing.get_args(hint) else Any
    item_check = None if item is Any else _checker(item, {})
    bounds = [(symbol, rules[key], ok) for key, symbol, ok in _BOUNDS if rules.get(key) is not None]
    choices, extra = rules.get("choices"), rules.get("check")
    resolved: list[tuple] = []  # the choices, read on first use

    def check(value: Any) -> str | None:
        if value is None:
            return None if nullable else "must be set, got null"
        if kinds is not None and (not isinstance(value, kinds) or (numeric and isinstance(value, bool))):
            return f"expected {_KIND_NAMES[origin]}, got {value!r}"
        if item_check is not None and any(item_check(v) for v in value):
            return f"expected a list of {_KIND_NAMES[item].split(' ', 1)[1]}s, got {value!r}"
        if choices is not None:
            if not resolved:
                resolved.append(tuple(choices() if callable(choices) else choices))
            if value not in resolved[0]:
                return f"{value!r} is not one of {', '.join(map(str, resolved[0]))}"
        for symbol, bound, ok in bounds:
            if not ok(value, bound):
                return f"must be {symbol} {bound}, got {value!r}"
        return extra(value) if extra is not None else None

    return check
