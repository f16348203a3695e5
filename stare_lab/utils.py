"""Small shared helpers: atomic writes, and a config section as a plain dict."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


def atomic_write(path: Path | str, write: Callable[[str], object]) -> None:
    """`write(tmp_path)` into a temp file in the same folder, then rename: readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path | str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    atomic_write(path, write)


def atomic_write_json(path: Path | str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def plain_dict(section: DictConfig | Any) -> dict[str, Any]:
    """A config section (a DictConfig, resolved, or any mapping) as a plain dict; TypeError naming the
    type for anything else (OmegaConf's `to_container` is typed for lists and scalars too)."""
    data = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else section
    if not isinstance(data, Mapping):
        raise TypeError(f"expected a mapping, got {type(data).__name__}")
    return {str(k): v for k, v in data.items()}
