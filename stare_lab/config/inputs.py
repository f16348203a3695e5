"""The files a run will read, checked before anything launches, and a training set that holds held-out problems.

`check_inputs(cfg)` fails with one line (ConfigError naming the key and the path) when a run would
stop on a missing input after it launched: a packaged model's files (`smollm2`: its converted folder
hashed against its record, else its pip package's GGUF and the gguf package; docs/models.md), a local
model folder (`model.name_or_path` starting with /, . or ~, or an existing path), a hub model not in
the local cache while HF_HUB_OFFLINE is set, a local task source (`task.train_source`,
`task.heldout_source`), the task's own held-out split named in `eval.benchmarks` without a
`task.heldout_source`, and a benchmark with neither a local copy nor hub access. Hub names are
otherwise left to the hub (they can not be checked without the network). It reads (and hashes) only
the file system: no torch, no datasets.

`overlap_warnings(cfg)` compares the problems of local training and held-out files (text with
whitespace collapsed) and returns one line per held-out set that shares problems with training.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from stare_lab.config.run_config import BENCHMARK_DATA_DIR, CONF_DIR, ConfigError
from stare_lab.models import PACKAGED, packaged_problems
from stare_lab.tasks.loaders import is_local_source

LOCAL_PREFIXES = ("/", ".", "~")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _local(source: str) -> bool:
    return is_local_source(source)


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache  # deferred: ~0.1 s, only for a hub model while offline

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def benchmark_source(name: str) -> str | None:
    """The source of a benchmark of conf/benchmark/ (its local copy when there is one), None if unknown."""
    for root in (os.environ.get("STARE_LAB_BENCHMARKS"), BENCHMARK_DATA_DIR):
        if root and (Path(root) / f"{name}.jsonl").is_file():
            return str(Path(root) / f"{name}.jsonl")
    path = CONF_DIR / "benchmark" / f"{name}.yaml"
    if not path.is_file():
        return None
    return str((yaml.safe_load(path.read_text()) or {}).get("source") or "")


def hub_problem(cfg: Mapping[str, Any]) -> str | None:
    """A hub model this machine can not load: not in the local cache while HF_HUB_OFFLINE is set."""
    model = str(cfg["model"]["name_or_path"])
    local = model in PACKAGED or model.startswith(LOCAL_PREFIXES) or Path(os.path.expanduser(model)).exists()
    if local or not _offline() or _hub_cached(model):
        return None
    return f"model.name_or_path: {model!r} is not in the local hub cache and HF_HUB_OFFLINE is set"


def input_problems(cfg: Mapping[str, Any], hub: bool = True) -> list[str]:
    """What `check_inputs` would refuse, one line each (empty: every input is there). `hub`: also
    `hub_problem` (a sweep's dry run only warns of it: the machine that launches may have the model)."""
    problems: list[str] = []
    model = str(cfg["model"]["name_or_path"])
    path = Path(os.path.expanduser(model))
    if model in PACKAGED:
        problems.extend(f"model.name_or_path: {line}" for line in packaged_problems(model))
    elif model.startswith(LOCAL_PREFIXES) or path.exists():
        if not (path / "config.json").is_file():
            what = "does not exist" if not path.exists() else "has no config.json (not a saved model)"
            problems.append(f"model.name_or_path: {model} {what}")
    elif hub and (offline := hub_problem(cfg)):
        problems.append(offline)
    task = cfg["task"]
    for key in ("train_source", "heldout_source"):
        source = task.get(key)
        if source and _local(str(source)) and not Path(os.path.expanduser(str(source))).is_file():
            problems.append(f"task.{key}: {source} does not exist")
    for name in cfg["eval"]["benchmarks"] if cfg["eval"].get("enabled", True) else []:
        if name == task.get("name"):
            if "heldout_source" in task and not task.get("heldout_source"):
                problems.append(
                    f"eval.benchmarks: {name!r} is the task's own held-out split, and task.heldout_source is not set"
                )
            continue
        source = benchmark_source(name)
        if source is None or source.startswith("builtin:"):
            continue  # unknown names are refused by the config checks; built-in sources are generated
        if _local(source) and not Path(os.path.expanduser(source)).is_file():
            problems.append(f"eval.benchmarks: {name}: its source {source} does not exist")
        elif not _local(source) and _offline():
            problems.append(f"eval.benchmarks: {name}: no local copy, and HF_HUB_OFFLINE is set (hub: {source})")
    return problems


def check_inputs(cfg: Mapping[str, Any], where: str = "") -> None:
    """ConfigError (one line) naming the first missing input; `where` names the run (a sweep's label)."""
    problems = input_problems(cfg)
    if problems:
        raise ConfigError(problems[0] + (f" ({where})" if where else ""))


def _problem_texts(source: str, field: Any, limit: int | None = None) -> set[str]:
    """Whitespace-collapsed problem texts of the first `limit` rows of a local JSONL file (empty for
    anything else: hub datasets and Parquet are not read here)."""
    path = Path(os.path.expanduser(source))
    if path.suffix.lower() != ".jsonl" or not path.is_file():
        return set()
    keys = [field] if isinstance(field, str) else list(field or ["problem", "question"])
    texts = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            texts.append(" ".join(str(next((row[k] for k in keys if k in row), "")).split()))
    return set(texts[:limit] if limit else texts) - {""}


def overlap_warnings(cfg: Mapping[str, Any]) -> list[str]:
    """One line per held-out set (the task's own, a benchmark's local copy) with problems also in training."""
    task = cfg["task"]
    if not task.get("train_source"):
        return []
    fields = task.get("fields") or {}
    train = _problem_texts(str(task["train_source"]), fields.get("problem"), task.get("train_limit"))
    if not train:
        return []
    lines = []
    for name in cfg["eval"]["benchmarks"] if cfg["eval"].get("enabled", True) else []:
        if name == task.get("name"):
            source = task.get("heldout_source")
            field = (task.get("heldout_fields") or fields).get("problem")
            held = _problem_texts(str(source), field, task.get("heldout_limit")) if source else set()
        else:
            source = benchmark_source(name)
            held = _problem_texts(source, None) if source else set()
        both = len(held & train)
        if both:
            lines.append(
                f"warning: {both} of {len(held)} held-out problems of {name!r} ({source}) are also in the "
                f"training set ({task['train_source']})"
            )
    return lines
