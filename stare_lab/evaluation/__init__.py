r"""Layer 3, evaluation: n samples per problem, per-sample records, avg@n, pass@k, maj@n.
May import layers 1-2, signals and training.

`evaluate_benchmark` reads top-down: the benchmark's verifier and prompts (benchmarks), this
process's samples (sampling), each sample checked, the rows of every process in record order, the
scores (scores), and `eval/<name>/<settings key>.parquet` (one row per sample) and `.json` written in
the formats of docs/run_record.md, atomically, through stare_lab.record. The names re-exported below
are the package's public API.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch.distributed as dist

from stare_lab.evaluation.benchmarks import (
    BENCHMARK_DIRS,
    VERIFIERS,
    benchmark_config,
    list_benchmarks,
    load_benchmark,
    record_prompt,
    resolve_scorer,
    resolve_verifier,
)
from stare_lab.evaluation.sampling import (
    engine_name,
    eval_shard,
    gather_rows,
    generate_samples,
    sample_units,
    unit_seed,
)
from stare_lab.evaluation.scores import avg_at_n, bootstrap_ci, maj_at_k, pass_at_k, per_problem_counts, summarize
from stare_lab.record import SAMPLE_COLUMNS, eval_result_path, write_eval_result
from stare_lab.tasks.math import MATH_TEMPLATE

__all__ = [
    "BENCHMARK_DIRS",
    "PARQUET_COLUMNS",
    "VERIFIERS",
    "avg_at_n",
    "benchmark_config",
    "bootstrap_ci",
    "engine_name",
    "eval_shard",
    "evaluate_benchmark",
    "gather_rows",
    "generate_samples",
    "list_benchmarks",
    "load_benchmark",
    "maj_at_k",
    "pass_at_k",
    "per_problem_counts",
    "resolve_scorer",
    "resolve_verifier",
    "sample_units",
    "summarize",
    "unit_seed",
]

PARQUET_COLUMNS = tuple(name for name, _ in SAMPLE_COLUMNS)


def evaluate_benchmark(
    model: Any,
    tokenizer: Any,
    task_or_verifier: Any,
    records: Sequence[Mapping[str, Any]],
    *,
    n: int,
    temperature: float = 1.0,
    top_p: float = 0.7,
    max_tokens: int = 1024,
    batch_size: int = 32,
    seed: int = 0,
    out_dir: str | Path,
    step: int | None = None,
    name: str,
    template: str | None = None,
    chat: bool = False,
    intermediate: bool = False,
) -> dict[str, Any]:
    """Sample n answers per record, verify, write `<out_dir>/eval/<name>/<settings key>.{parquet,json}`
    (stare_lab.record.write_eval_result; `final` is False when `intermediate`), and return the JSON
    object (metrics under "metrics").

    records: dicts with `problem_id`, `answer` (gold) and `problem` (formatted with `template`,
    default the fixed `\\boxed{}` template) or an already formatted `prompt`.
    """
    verifier, extract, _ = resolve_verifier(task_or_verifier)
    prompts = [record_prompt(r, template or MATH_TEMPLATE, chat) for r in records]
    rank, processes = eval_shard()
    samples = generate_samples(
        model, tokenizer, prompts, n, temperature, top_p, max_tokens, batch_size, seed, shard=(rank, processes)
    )
    rows = checked_rows(records, samples, extract, resolve_scorer(task_or_verifier))
    if processes > 1:
        rows = gather_rows(rows)
    rows = [
        {k: v for k, v in r.items() if k != "_order"}
        for r in sorted(rows, key=lambda r: (r["_order"], r["sample_index"]))
    ]
    settings = {"n": n, "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "verifier": verifier}
    result = {
        "benchmark": name,
        "step": step,
        "final": not intermediate,
        **settings,
        "engine": engine_name(model),
        "num_problems": len(records),
        "metrics": summarize(
            pd.DataFrame(rows, columns=list(PARQUET_COLUMNS)),
            n,
            partial=bool(getattr(task_or_verifier, "partial_credit", False)),
        ),
    }
    path = write_eval_result(out_dir, result, rows) if rank == 0 else eval_result_path(out_dir, name, result, step)
    if processes > 1:
        dist.barrier()  # the result is on disk before any rank looks for it
    return {**result, "settings_key": path.stem}


def checked_rows(
    records: Sequence[Mapping[str, Any]],
    samples: Sequence[Sequence[tuple[str, int]] | None],
    extract: Callable[[str], Any],
    score: Callable[[str, Any, Mapping[str, Any]], float],
) -> list[dict[str, Any]]:
    """One row per sample of this process's records (None: another rank's problem), scored against the
    gold (stare_lab.evaluation.benchmarks.resolve_scorer: correct at 1.0); `_order` is the record's
    index, by which the rows of every rank are put back in order."""
    rows = []
    for index, (record, outputs) in enumerate(zip(records, samples, strict=True)):
        gold = str(record["answer"])
        for j, (text, length) in enumerate(outputs or []):
            extracted = extract(text)
            value = float(score(text, extracted, record))
            rows.append(
                {
                    "problem_id": str(record["problem_id"]),
                    "sample_index": j,
                    "answer": text,
                    "extracted": None if extracted is None else str(extracted),
                    "gold": gold,
                    "correct": value == 1.0,
                    "length": int(length),
                    "score": value,
                    "_order": index,
                }
            )
    return rows
