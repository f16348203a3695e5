"""Layer 1, the tasks: datasets, prompts, verifiers and rewards.
May import core and record.

Tasks: datasets, prompts and verifiers. `build_task(cfg)` picks one by `cfg["name"]`.

A task has `name`, `train_dataset()`, `heldout_dataset()` (datasets with columns `prompt`,
`answer`, `problem_id`), `extract(completion)`, `verify(completion, answer)` and
`reward(completions, answer, **kwargs)` (a TRL reward function). A task whose score needs the problem
itself (reasoning_gym: each dataset scores against its entry, partial credit included) also has
`score(completion, extracted, record)`, which evaluation uses instead of `verify` (docs/tasks.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stare_lab.core.utils import plain_dict
from stare_lab.tasks.loaders import load_records
from stare_lab.tasks.math import MATH_TEMPLATE, MathTask, build_prompt, extract_boxed, math_reward
from stare_lab.tasks.reasoning_gym import ReasoningGymTask
from stare_lab.tasks.rewards import REWARD_KEYS

TASK_NAMES = ("arithmetic", "math", "reasoning_gym")

__all__ = [
    "MATH_TEMPLATE",
    "MathTask",
    "TASK_NAMES",
    "build_prompt",
    "build_task",
    "extract_boxed",
    "load_records",
    "math_reward",
]


def build_task(cfg: Mapping[str, Any] | Any):
    """The task named by `cfg["name"]` (a dict or OmegaConf DictConfig), built from its other keys."""
    # the training reward (task.reward, task.reward_p) is the run's, not the task's: stare_lab.tasks.rewards
    cfg = {k: v for k, v in plain_dict(cfg).items() if k not in REWARD_KEYS}
    name = cfg.get("name")
    if name == "math":
        return MathTask.from_config(cfg)
    if name == "arithmetic":
        from stare_lab.tasks.arithmetic import ArithmeticTask  # deferred: it imports datasets

        if hasattr(ArithmeticTask, "from_config"):
            return ArithmeticTask.from_config(cfg)
        return ArithmeticTask(**{k: v for k, v in cfg.items() if k != "name"})
    if name == "reasoning_gym":
        return ReasoningGymTask.from_config(cfg)
    raise ValueError(f"task.name: unknown task {name!r}; valid names: {list(TASK_NAMES)}")
