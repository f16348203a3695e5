"""How runs are named as arms: the rule label and the config keys that split a label into arms.

One home for the rule that `collect` applies to run records and that a claim's check applies to a
sweep's planned runs before any of them exists (stare_lab.plan.claims), so a claim names an arm
exactly as the report will. Pure Python (no pandas): a sweep's refusals never import it.

An arm is named by its rule label (`method.name`, plus the run's variant when the config has
`run.variant`, e.g. `rsi_band[0.5,1]`). A control arm (CONTROL_ARMS: the untrained model `base`, and
`random_reward`, the baseline rule trained on random rewards) is named by its variant alone. When runs
sharing a label still differ in other config keys (a grid over the learning rate without variants),
the differing keys are appended, e.g. `stare trainer.learning_rate=1e-06`, so such runs are never
averaged together. Keys that differ per run by construction (seeds, `run.*`, `logger.*`, directories
and paths) do not split arms.
"""

from __future__ import annotations

import json
from typing import Any

from stare_lab.core.controls import CONTROLS

# Arms a sweep adds with its top-level `controls:` (issue 37); their label is the control's name.
CONTROL_ARMS = CONTROLS  # stare_lab.core.controls: base, random_reward


def rule_label(method: str, variant: str | None) -> str:
    """`method`, or `method` with its variant: "rsi_band" + "[0.5,1]" → "rsi_band[0.5,1]".

    A variant that already starts with the method name, or names a control arm (CONTROL_ARMS), is
    used as is; any other variant name is put in brackets: ("rsi_band", "low") → "rsi_band[low]".
    """
    if variant is None or str(variant) == "":
        return str(method)
    variant = str(variant)
    if variant.startswith(str(method)) or variant in CONTROL_ARMS:
        return variant
    if variant.startswith("["):
        return f"{method}{variant}"
    return f"{method}[{variant}]"


def splits_arm(key: str) -> bool:
    """Whether a differing config key separates arms (see the module docstring)."""
    if key in ("seed",) or key.startswith(("run.", "logger.")):
        return False
    leaf = key.rsplit(".", 1)[-1].lower()
    return not any(word in leaf for word in ("seed", "dir", "path", "output"))


def arm_names(configs: list[dict[str, Any]]) -> list[str]:
    """The arm of each run, from its flat config ({"method.name": .., "run.variant": .., ...})."""
    names = [rule_label(str(c.get("method.name", "unknown")), c.get("run.variant")) for c in configs]
    by_label: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        by_label.setdefault(name, []).append(i)
    out = list(names)
    for label, idx in by_label.items():
        if len(idx) < 2:
            continue
        # (key, type, value): 1, 1.0 and true are different settings, as their JSON is; a key one run lacks differs
        first = _items(configs[idx[0]])
        changed = set().union(*({k for k, _, _ in first ^ _items(configs[i])} for i in idx[1:]))
        differing = sorted(k for k in changed if splits_arm(k))
        for i in idx:
            suffix = " ".join(f"{k}={configs[i].get(k)}" for k in differing)
            if suffix:
                out[i] = f"{label} {suffix}"
    return out


def _items(config: dict[str, Any]) -> set[tuple[str, str, Any]]:
    return {(k, *_typed(v)) for k, v in config.items()}


def _typed(value: Any) -> tuple[str, Any]:
    try:
        hash(value)
    except TypeError:
        value = json.dumps(value, default=str)
    return type(value).__name__, value


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict → {"a.b.c": value}; lists and other non-scalars become JSON strings."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out
