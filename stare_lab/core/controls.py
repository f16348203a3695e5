"""Controls: the arms of a sweep that are not token rules.

- ``base``: the untrained model. A run of ``method=base`` (or of any rule with
  ``trainer.max_steps=0``) trains 0 steps: it writes a normal record (config, provenance, status)
  and the starting checkpoint's evaluation, under the same evaluation settings, problems and
  evaluation seeds as the trained arms, without loading the trainer. Tables show it as the row
  ``base`` above the baseline, with the baseline's RL gain over it.
- ``random_reward``: the baseline rule trained under ``task.reward: random`` (Bernoulli(p)
  rewards independent of correctness; Shao et al., arXiv 2506.10947, "Spurious Rewards"). A
  rule's gain over the baseline means little until "any update helps" is ruled out.

A sweep adds them with one key, ``controls: [base, random_reward]``; each runs for every seed of
the sweep, from the sweep's ``base`` settings (no grid axis applies to them).
"""

from __future__ import annotations

from typing import Any

BASE = "base"
RANDOM_REWARD = "random_reward"
CONTROLS = (BASE, RANDOM_REWARD)
# The rule a control stands beside: tables' default baseline, the rule random_reward trains.
BASELINE_RULE = "full"


def control_overrides(name: str) -> list[tuple[str, Any]]:
    """The overrides a control applies to the sweep's base settings (`controls: [name]`)."""
    if name == BASE:
        return [("method", BASE)]
    if name == RANDOM_REWARD:
        return [("method", BASELINE_RULE), ("task.reward", "random")]
    raise ValueError(f"unknown control {name!r}; valid: {', '.join(CONTROLS)}")


def trains(cfg: Any) -> bool:
    """Whether a run's config trains at all (``method=base`` resolves to 0 steps)."""
    return int(cfg["trainer"]["max_steps"]) > 0
