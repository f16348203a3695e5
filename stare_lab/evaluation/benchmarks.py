"""A benchmark: its config (conf/benchmark/<name>.yaml, a YAML path or a mapping), its records (a
built-in task's held-out set, or a dataset read by stare_lab.tasks.loaders) and its verifier
("math_verify": the last `\\boxed{}` against the gold with math-verify; "exact": the task's own `verify`)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from stare_lab.config.run_config import CONF_DIR
from stare_lab.core.utils import plain_dict
from stare_lab.tasks import build_task
from stare_lab.tasks.loaders import load_records
from stare_lab.tasks.math import build_prompt, chat_messages, extract_boxed, verify_boxed

BENCHMARK_DIRS = (CONF_DIR / "benchmark",)
VERIFIERS = ("math_verify", "exact", "reasoning_gym")


def resolve_verifier(task_or_verifier: Any) -> tuple[str, Callable[[str], Any], Callable[[str, Any, str], bool]]:
    """(verifier name, extract(text), check(text, extracted, gold)) of a verifier's name or a task."""
    if isinstance(task_or_verifier, str):
        if task_or_verifier == "math_verify":
            return "math_verify", extract_boxed, lambda text, ext, gold: verify_boxed(ext, gold)
        if task_or_verifier == "exact":
            task_or_verifier = build_task({"name": "arithmetic"})
        elif task_or_verifier == "reasoning_gym":
            raise ValueError("verifier reasoning_gym scores against each problem's entry: pass the task itself")
        else:
            raise ValueError(f"verifier: unknown {task_or_verifier!r}; valid: {list(VERIFIERS)}")
    task = task_or_verifier
    name = getattr(task, "verifier", None) or ("math_verify" if getattr(task, "name", "") == "math" else "exact")
    return name, task.extract, lambda text, ext, gold: bool(task.verify(text, gold))


def resolve_scorer(task_or_verifier: Any) -> Callable[[str, Any, Mapping[str, Any]], float]:
    """score(text, extracted, record) of a verifier: the task's own `score` (a dataset's partial credit,
    against the problem's entry), else 1.0 where the verifier's check passes and 0.0 elsewhere."""
    score = getattr(task_or_verifier, "score", None)
    if callable(score):
        return score
    _, _, check = resolve_verifier(task_or_verifier)
    return lambda text, ext, record: float(bool(check(text, ext, str(record["answer"]))))


def record_prompt(record: Mapping[str, Any], template: str, chat: bool) -> Any:
    """The prompt of one benchmark record: its own `prompt`, else its `problem` in `template` (chat messages
    when `chat`)."""
    if record.get("prompt") is not None:  # already formatted (e.g. the arithmetic held-out set)
        return record["prompt"]
    return chat_messages(record["problem"], template) if chat else build_prompt(record["problem"], template)


def load_benchmark(
    cfg_or_name: Any, source_override: str | None = None
) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """(name, records, settings) for a benchmark: a name from conf/benchmark/, a YAML path, or a
    dict / DictConfig with that file's keys. `source_override` replaces `source` (e.g. a local
    JSONL copy). settings: `n`, `verifier`, `source`, `split`, `subset`, and the benchmark's own
    `temperature`, `top_p`, `max_tokens` (None where its file does not set them).
    """
    cfg = benchmark_config(cfg_or_name)
    for key in ("name", "source", "n", "verifier"):
        if cfg.get(key) is None:
            raise ValueError(f"benchmark.{key} is missing in {cfg.get('name', cfg_or_name)!r}")
    if cfg["verifier"] not in VERIFIERS:
        raise ValueError(f"benchmark.verifier: unknown {cfg['verifier']!r}; valid: {list(VERIFIERS)}")
    source = str(source_override or cfg["source"])
    if source.startswith("builtin:"):
        dataset = build_task({"name": source.split(":", 1)[1]}).heldout_dataset()
        records = [
            {
                "problem": r["prompt"],
                "prompt": r["prompt"],
                "answer": str(r["answer"]),
                "problem_id": str(r["problem_id"]),
            }
            for r in dataset
        ]
        if cfg.get("limit") is not None:
            records = records[: int(cfg["limit"])]
    else:
        records = load_records(
            source,
            split=cfg.get("split", "test"),
            fields=cfg.get("fields"),
            subset=cfg.get("subset"),
            limit=cfg.get("limit"),
        )
        records = [_clean_gold(r, cfg) for r in records]
    settings = {
        "n": int(cfg["n"]),
        "verifier": cfg["verifier"],
        "source": source,
        **{k: cfg.get(k) for k in ("temperature", "top_p", "max_tokens")},
        "split": cfg.get("split", "test"),
        "subset": cfg.get("subset"),
    }
    return str(cfg["name"]), records, settings


def _clean_gold(record: dict[str, Any], cfg: Mapping[str, Any]) -> dict[str, Any]:
    answer = record["answer"]
    if cfg.get("answer_regex"):
        m = re.search(cfg["answer_regex"], answer, flags=re.S)
        if m is None:
            raise ValueError(
                f"benchmark {cfg['name']}: answer_regex {cfg['answer_regex']!r} does not match "
                f"the answer of problem {record['problem_id']}"
            )
        answer = m.group(1).strip()
    if cfg.get("strip_commas"):
        answer = answer.replace(",", "")
    return {**record, "answer": answer}


def benchmark_config(cfg_or_name: Any) -> dict[str, Any]:
    """A benchmark's keys from its name (conf/benchmark/), a YAML path, or a mapping."""
    if isinstance(cfg_or_name, Mapping):  # a DictConfig too
        return plain_dict(cfg_or_name)
    text = str(cfg_or_name)
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        path = Path(os.path.expanduser(text))
        if not path.is_file():
            raise FileNotFoundError(f"benchmark config not found: {path}")
    else:
        found = next((d / f"{text}.yaml" for d in BENCHMARK_DIRS if (d / f"{text}.yaml").is_file()), None)
        if found is None:
            raise ValueError(f"benchmark: unknown {text!r}; known: {list_benchmarks()}")
        path = found
    return plain_dict(OmegaConf.load(path))


def list_benchmarks() -> list[str]:
    """Names of the benchmark configs under conf/benchmark/."""
    return sorted({p.stem for d in BENCHMARK_DIRS if d.is_dir() for p in d.glob("*.yaml")})
