"""The training reward of a run: the task's verifier, or a control reward (``task.reward``).

- ``verifier`` (default): the task's own reward, 1.0 where the answer is right.
- ``random``: Bernoulli(``reward_p``) per sample, independent of the completion and of its
  correctness: the spurious-reward control of Shao et al. (arXiv 2506.10947, "Spurious
  Rewards"; p = 0.5 there). Each draw is seeded by (run seed, optimizer step of the generation,
  process rank) and taken in sample order, so a resumed run redraws the same rewards and two
  ranks never share draws.
- ``format`` (math): 1.0 where the completion has a ``\\boxed{}`` answer, right or wrong.

Under a control reward the verifier still runs with weight 0 (TRL's ``reward_weights``): it does
not enter the advantages, and ``rewards/accuracy/mean`` keeps logging the true training accuracy
beside the reward the policy was trained on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from stare_lab.record import process_rank
from stare_lab.tasks.math import completion_text, extract_boxed

REWARD_KEYS = ("reward", "reward_p")
RewardFn = Callable[..., list[float]]


def verifier_reward(task) -> RewardFn:
    """The task's verifier as a TRL reward function named `accuracy` (logged as rewards/accuracy/mean)."""

    def accuracy(completions, answer, **kwargs):
        return task.reward(completions, answer, **kwargs)

    return accuracy


def bernoulli_reward(p: float, seed: int) -> RewardFn:
    """Bernoulli(p) rewards, one per completion, independent of what was generated."""

    def random(completions, trainer_state=None, **kwargs):
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), step, process_rank()]))
        return (rng.random(len(completions)) < p).astype(float).tolist()

    return random


def format_reward(completions, **kwargs) -> list[float]:
    r"""1.0 where the completion's last ``\boxed{}`` holds an answer (math-verify is not asked)."""
    return [float(extract_boxed(completion_text(c)) is not None) for c in completions]


def training_rewards(task, task_cfg: Mapping[str, Any], seed: int) -> tuple[list[RewardFn], list[float]]:
    """(reward functions, their weights) for TRL: the verifier alone, or a control reward with the
    verifier beside it at weight 0."""
    kind = task_cfg.get("reward", "verifier") or "verifier"
    accuracy = verifier_reward(task)
    if kind == "verifier":
        return [accuracy], [1.0]
    if kind == "random":
        return [bernoulli_reward(float(task_cfg.get("reward_p", 0.5)), seed), accuracy], [1.0, 0.0]
    if kind == "format":
        if task.name != "math":
            raise ValueError(f"task.reward: format needs \\boxed{{}} answers (task 'math'), not task {task.name!r}")
        return [format_reward, accuracy], [1.0, 0.0]
    raise ValueError(f"task.reward: unknown reward {kind!r}; valid: verifier, random, format")
