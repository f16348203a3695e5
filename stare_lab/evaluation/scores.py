"""The scores of an evaluation from its per-sample records (problem_id, sample_index, extracted,
correct): avg@n with a bootstrap interval over problems, unbiased pass@k, and maj@n."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd


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


def summarize(records_df: Any, n: int, partial: bool = False) -> dict[str, Any]:
    """`{"avg@n", "avg@n_ci", "pass@1", "pass@2", "pass@4", ... (k ≤ n, powers of 2), "maj@n"}`; with
    `partial` (a verifier that gives partial credit, rows with `score`) also `score@n` (the mean score per
    problem, then over problems, with `score@n_ci`) and `no_answer` (the fraction of samples without an
    extracted answer)."""
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
    if partial:
        scores = df.groupby("problem_id", sort=False)["score"].mean().to_numpy(dtype=np.float64)
        metrics[f"score@{n}"] = float(scores.mean())
        metrics[f"score@{n}_ci"] = list(bootstrap_ci(scores))
        metrics["no_answer"] = float(df["extracted"].isna().mean())
    return metrics
