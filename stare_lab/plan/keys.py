"""Config keys as a sweep file writes them (grid axes, overrides, search parameters)."""

from __future__ import annotations

import re
from typing import Any

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def check_key(key: Any, path: str, fail) -> None:
    """A dotted config key the sweep may set, or `fail(path, why)`."""
    if not isinstance(key, str) or not _KEY.match(key):
        fail(path, f"{key!r} is not a config key (dotted identifiers, e.g. trainer.max_steps)")
    head = key.split(".")[0]
    if head in ("run", "seed"):
        fail(path, f"{key!r} is set by the sweep itself (use seeds: for seeds)")
    if head == "launcher":
        fail(path, "the launcher is the sweep's top-level `launcher:` block, not a config override")
