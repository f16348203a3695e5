r"""Evaluation: n samples per problem, per-sample records, avg@n, pass@k, maj@n.

`evaluate_benchmark` samples with `generate_samples`, checks each sample with the benchmark's
verifier ("math_verify": last `\boxed{}` against the gold with math-verify; "exact": the task's own
`verify`, e.g. arithmetic), and writes `eval/<name>/<settings key>.parquet` (one row per sample)
and `.json` in the formats of docs/run_record.md, atomically, through stare_lab.record.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stare_lab.config import CONF_DIR
from stare_lab.record import SAMPLE_COLUMNS

BENCHMARK_DIRS = (CONF_DIR / "benchmark",)
VERIFIERS = ("math_verify", "exact")
PARQUET_COLUMNS = tuple(name for name, _ in SAMPLE_COLUMNS)


# ----------------------------------------------------------------------------------- metrics
def pass_at_k(n: Any, c: Any, k: Any) -> Any:
    """Unbiased pass@k (Chen et al. 2021) per problem: 1 - C(n-c, k) / C(n, k).

    Stable product form: 1 if n - c < k, else 1 - Π_{i=n-c+1..n} (1 - k/i). n, c, k broadcast;
    arrays give an array, scalars a float. k > n, c outside [0, n] or k < 1: ValueError.
    """
    n_a, c_a, k_a = np.broadcast_arrays(np.asarray(n), np.asarray(c), np.asarray(k))
    if np.any(k_a < 1):
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if np.any(k_a > n_a):
        raise ValueError(f"pass@k needs k <= n (samples per problem), got k={k}, n={n}")
    if np.any(c_a < 0) or np.any(c_a > n_a):
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    out = np.empty(n_a.shape, dtype=np.float64)
    for idx in np.ndindex(n_a.shape):
        ni, ci, ki = int(n_a[idx]), int(c_a[idx]), int(k_a[idx])
        if ni - ci < ki:
            out[idx] = 1.0
        else:
            out[idx] = 1.0 - float(np.prod(1.0 - ki / np.arange(ni - ci + 1, ni + 1, dtype=np.float64)))
    return float(out) if out.ndim == 0 else out


def _records_frame(records: Any) -> pd.DataFrame:
    if isinstance(records, pd.DataFrame):
        return records
    return pd.DataFrame(list(records))


def _is_records(data: Any) -> bool:
    if isinstance(data, pd.DataFrame):
        return True
    return isinstance(data, Sequence) and len(data) > 0 and isinstance(data[0], Mapping)


def per_problem_counts(records: Any) -> pd.DataFrame:
    """Per problem (first-appearance order): `n` samples and `c` correct, indexed by problem_id."""
    df = _records_frame(records)
    g = df.groupby("problem_id", sort=False)["correct"]
    return pd.DataFrame({"n": g.size(), "c": g.sum().astype(int)})


def avg_at_n(data: Any) -> float:
    """avg@n: mean correctness per problem, then mean over problems.

    data: a [problems, n] 0/1 matrix, or per-sample records (DataFrame or dicts with
    `problem_id` and `correct`).
    """
    if _is_records(data):
        counts = per_problem_counts(data)
        return float((counts["c"] / counts["n"]).mean())
    matrix = np.asarray(data, dtype=np.float64)
    if matrix.ndim != 2 or matrix.size == 0:
        raise ValueError(f"avg@n needs a non-empty [problems, n] matrix, got shape {matrix.shape}")
    return float(matrix.mean(axis=1).mean())


def maj_at_k(records: Any, k: int | None = None) -> float:
    """maj@k: per problem, the most frequent extracted answer among samples with index < k
    (whitespace ignored; ties go to the answer seen first; no extracted answer scores 0) is
    scored by its samples' correctness; mean over problems.

    Answers are grouped by string, not by mathematical equivalence (`1/2` and `\\frac12` are two
    votes for different answers): the usual approximation.
    """
    df = _records_frame(records)
    if k is not None:
        df = df[df["sample_index"] < k]
    scores = []
    for _, group in df.sort_values("sample_index", kind="stable").groupby("problem_id", sort=False):
        voted = group[group["extracted"].notna()]
        if voted.empty:
            scores.append(0.0)
            continue
        keys = voted["extracted"].map(lambda s: re.sub(r"\s+", "", str(s)))
        counts = keys.value_counts(sort=False)
        winner = counts.index[int(np.argmax(counts.to_numpy()))]  # argmax: first of the ties
        scores.append(float(bool(voted.loc[keys == winner, "correct"].iloc[0])))
    return float(np.mean(scores)) if scores else 0.0


def bootstrap_ci(
    per_problem_values: Any, n_boot: int = 1000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean, resampling problems with replacement."""
    values = np.asarray(per_problem_values, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("bootstrap_ci needs at least one per-problem value")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def summarize(records_df: Any, n: int) -> dict[str, Any]:
    """`{"avg@n", "avg@n_ci", "pass@1", "pass@2", "pass@4", ... (k ≤ n, powers of 2), "maj@n"}`."""
    df = _records_frame(records_df)
    counts = per_problem_counts(df)
    short = counts[counts["n"] != n]
    if len(short):
        raise ValueError(f"summarize: problem {short.index[0]!r} has {int(short['n'].iloc[0])} samples, expected n={n}")
    accuracy = (counts["c"] / counts["n"]).to_numpy()
    metrics: dict[str, Any] = {f"avg@{n}": float(accuracy.mean()), f"avg@{n}_ci": list(bootstrap_ci(accuracy))}
    k = 1
    while k <= n:
        metrics[f"pass@{k}"] = float(np.mean(pass_at_k(counts["n"].to_numpy(), counts["c"].to_numpy(), k)))
        k *= 2
    metrics[f"maj@{n}"] = maj_at_k(df, n)
    return metrics


# -------------------------------------------------------------------------------- sampling
def sample_units(num_prompts: int, n: int, batch_size: int) -> list[list[list[tuple[int, int]]]]:
    """The (prompt, sample) jobs in seeded units, each a list of generate batches. A unit is
    ⌊batch_size / n⌋ whole prompts in one batch, or, when n > batch_size, one prompt in batches of
    batch_size. Samples depend only on (seed, unit), never on which process draws the unit."""
    if n <= batch_size:
        per = batch_size // n
        return [
            [[(i, j) for i in range(a, min(a + per, num_prompts)) for j in range(n)]]
            for a in range(0, num_prompts, per)
        ]
    return [
        [[(i, j) for j in range(b, min(b + batch_size, n))] for b in range(0, n, batch_size)]
        for i in range(num_prompts)
    ]


def unit_seed(seed: int, unit: int) -> int:
    """The torch seed of one unit of samples (a fixed mix of the run's seed and the unit index)."""
    return (int(seed) * 1_000_003 + unit) % (2**63 - 1)


def generate_samples(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    n: int,
    temperature: float = 1.0,
    top_p: float = 0.7,
    max_tokens: int = 1024,
    batch_size: int = 32,
    seed: int = 0,
    shard: tuple[int, int] = (0, 1),
) -> list[list[tuple[str, int]] | None]:
    """n completions per prompt as `(text, length)`: length counts generated tokens up to and
    including the first EOS. A prompt is text, or a message list rendered by the chat template.

    transformers path: `generate` over left-padded batches (`sample_units`: whole prompts with
    all their n samples, each unit seeded by `unit_seed(seed, unit)`), sampling with exactly T and
    top-p (top-k and repetition penalty from a model's generation_config are switched off so every
    table's T/top-p is the whole story). `shard = (rank, processes)`: this process draws units
    rank, rank + processes, ...; prompts of other units are None. Any sharding gives the samples
    of one process. A `vllm.LLM` model uses vLLM's sampler instead (`_generate_vllm`: the same T, top-p,
    seeds per prompt and sharding by prompt).
    """
    if _is_vllm_model(model):
        return _generate_vllm(model, prompts, n, temperature, top_p, max_tokens, seed, shard)
    import torch
    from tqdm.auto import tqdm

    chat = bool(prompts) and not isinstance(prompts[0], str)
    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) if chat else p for p in prompts
    ]
    eos = _eos_ids(model, tokenizer)
    saved = (tokenizer.padding_side, tokenizer.pad_token)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    sampling = (
        dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        if temperature > 0
        else dict(do_sample=False)
    )
    rank, processes = shard
    units = list(enumerate(sample_units(len(texts), n, batch_size)))[rank::processes]
    out: list[list[Any] | None] = [None] * len(texts)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for u, batches in tqdm(units, desc="sampling", unit="unit", leave=False):
            torch.manual_seed(unit_seed(seed, u))
            for batch in batches:
                enc = tokenizer(
                    [texts[i] for i, _ in batch], return_tensors="pt", padding=True, add_special_tokens=not chat
                ).to(device)
                with torch.no_grad():
                    ids = model.generate(
                        **enc,
                        max_new_tokens=max_tokens,
                        pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=sorted(eos),
                        repetition_penalty=1.0,
                        **sampling,
                    )
                for row, (i, j) in zip(ids[:, enc["input_ids"].shape[1] :].tolist(), batch, strict=True):
                    length = next((t + 1 for t, tok in enumerate(row) if tok in eos), len(row))
                    out[i] = out[i] or [None] * n
                    out[i][j] = (tokenizer.decode(row[:length], skip_special_tokens=True), length)
    finally:
        tokenizer.padding_side, tokenizer.pad_token = saved
        model.train(was_training)
    return out


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = set()
    for source in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        if source is not None:
            ids.update(source if isinstance(source, (list, tuple)) else [source])
    if not ids:
        raise ValueError(
            "generate_samples: neither the model's generation_config nor the tokenizer defines an EOS token"
        )
    return {int(i) for i in ids}


def _is_vllm_model(model: Any) -> bool:
    try:
        import vllm
    except ImportError:
        return False
    return isinstance(model, vllm.LLM)


def engine_name(model: Any) -> str:
    """The sampler an evaluation result records in its settings: "vllm" or "transformers"."""
    return "vllm" if _is_vllm_model(model) else "transformers"


def _generate_vllm(
    llm: Any,
    prompts: Sequence[Any],
    n: int,
    temperature: float,
    top_p: float,
    max_tokens: int,
    seed: int,
    shard: tuple[int, int] = (0, 1),
) -> list[list[tuple[str, int]] | None]:
    """vLLM's sampler with exactly T and top-p (top-k off, no penalties), prompt i seeded by
    `unit_seed(seed, i)` (the same samples however the prompts are sharded); this shard's prompts
    are rank, rank + processes, ...; the others are None. Lengths count tokens up to and including
    EOS, as the transformers path does."""
    from vllm import SamplingParams

    rank, processes = shard
    mine = list(range(len(prompts)))[rank::processes]
    params = [
        SamplingParams(
            n=n, temperature=temperature, top_p=top_p, top_k=0, max_tokens=max_tokens, seed=unit_seed(seed, i)
        )
        for i in mine
    ]
    out: list[list[tuple[str, int]] | None] = [None] * len(prompts)
    if not mine:
        return out
    chosen = [prompts[i] for i in mine]
    chat = not isinstance(chosen[0], str)
    results = llm.chat(chosen, params, use_tqdm=False) if chat else llm.generate(chosen, params, use_tqdm=False)
    for i, r in zip(mine, results, strict=True):
        out[i] = [(o.text, len(o.token_ids)) for o in r.outputs]
    return out


# ------------------------------------------------------------------------------ benchmarks
def _resolve_verifier(task_or_verifier: Any) -> tuple[str, Callable[[str], Any], Callable[[str, Any, str], bool]]:
    """(verifier name, extract(text), check(text, extracted, gold))."""
    from stare_lab.tasks.math import extract_boxed, verify_boxed

    if isinstance(task_or_verifier, str):
        if task_or_verifier == "math_verify":
            return "math_verify", extract_boxed, lambda text, ext, gold: verify_boxed(ext, gold)
        if task_or_verifier == "exact":
            from stare_lab.tasks import build_task

            task_or_verifier = build_task({"name": "arithmetic"})
        else:
            raise ValueError(f"verifier: unknown {task_or_verifier!r}; valid: {list(VERIFIERS)}")
    task = task_or_verifier
    name = getattr(task, "verifier", None) or ("math_verify" if getattr(task, "name", "") == "math" else "exact")
    return name, task.extract, lambda text, ext, gold: bool(task.verify(text, gold))


def _record_prompt(record: Mapping[str, Any], template: str, chat: bool) -> Any:
    from stare_lab.tasks.math import build_prompt, chat_messages

    if record.get("prompt") is not None:  # already formatted (e.g. the arithmetic held-out set)
        return record["prompt"]
    return chat_messages(record["problem"], template) if chat else build_prompt(record["problem"], template)


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
    out_dir: str | os.PathLike,
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
    from stare_lab.record import eval_result_path, write_eval_result
    from stare_lab.tasks.math import MATH_TEMPLATE

    verifier, extract, check = _resolve_verifier(task_or_verifier)
    prompts = [_record_prompt(r, template or MATH_TEMPLATE, chat) for r in records]
    rank, processes = eval_shard()
    samples = generate_samples(
        model, tokenizer, prompts, n, temperature, top_p, max_tokens, batch_size, seed, shard=(rank, processes)
    )
    rows = []
    for index, (record, outputs) in enumerate(zip(records, samples, strict=True)):
        gold = str(record["answer"])
        for j, (text, length) in enumerate(outputs or []):  # None: another rank's problem
            extracted = extract(text)
            rows.append(
                {
                    "problem_id": str(record["problem_id"]),
                    "sample_index": j,
                    "answer": text,
                    "extracted": None if extracted is None else str(extracted),
                    "gold": gold,
                    "correct": bool(check(text, extracted, gold)),
                    "length": int(length),
                    "_order": index,
                }
            )
    if processes > 1:
        rows = gather_rows(rows)
    rows = [
        {k: v for k, v in r.items() if k != "_order"}
        for r in sorted(rows, key=lambda r: (r["_order"], r["sample_index"]))
    ]
    df = pd.DataFrame(rows, columns=list(PARQUET_COLUMNS))
    result = {
        "benchmark": name,
        "step": step,
        "final": not intermediate,
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_tokens,
        "verifier": verifier,
        "engine": engine_name(model),
        "num_problems": len(records),
        "metrics": summarize(df, n),
    }
    if rank == 0:
        path = write_eval_result(out_dir, result, rows)
    else:
        path = eval_result_path(out_dir, name, result, step)
    if processes > 1:
        import torch.distributed as dist

        dist.barrier()  # the result is on disk before any rank looks for it
    return {**result, "settings_key": path.stem}


def eval_shard() -> tuple[int, int]:
    """(rank, processes) of a multi-process run's evaluation: torch.distributed's when it is
    running with several processes, else (0, 1)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 0, 1
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's per-sample rows, on every rank (one all_gather_object)."""
    import torch.distributed as dist

    shares: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shares, rows)
    return [r for share in shares for r in share]


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
        from stare_lab.tasks import build_task

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
        from stare_lab.tasks.loaders import load_records

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
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg_or_name, DictConfig):
        return dict(OmegaConf.to_container(cfg_or_name, resolve=True))
    if isinstance(cfg_or_name, Mapping):
        return dict(cfg_or_name)
    text = str(cfg_or_name)
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        path = Path(os.path.expanduser(text))
        if not path.is_file():
            raise FileNotFoundError(f"benchmark config not found: {path}")
    else:
        path = next((d / f"{text}.yaml" for d in BENCHMARK_DIRS if (d / f"{text}.yaml").is_file()), None)
        if path is None:
            raise ValueError(f"benchmark: unknown {text!r}; known: {list_benchmarks()}")
    return dict(OmegaConf.to_container(OmegaConf.load(path), resolve=True))


def list_benchmarks() -> list[str]:
    """Names of the benchmark configs under conf/benchmark/."""
    return sorted({p.stem for d in BENCHMARK_DIRS if d.is_dir() for p in d.glob("*.yaml")})
