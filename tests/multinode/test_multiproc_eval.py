"""Evaluation of a multi-process run: sampling sharded over 2 gloo processes and gathered equals
one process with the same seed, sample by sample (samples are seeded per unit of problems, not per
rank: stare_lab.evaluation.sample_units), and rank 0 alone writes the result. ~25 s."""

from __future__ import annotations

import os
import socket

import pandas as pd
import torch.multiprocessing as mp

from stare_lab.evaluation import sample_units

# (n, batch_size): whole problems per batch (7 problems → 4 units, 2 ranks unevenly), and one
# problem in several batches (n > batch_size)
SETTINGS = [(4, 8), (5, 2)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _records():
    from stare_lab.evaluation.run_eval import _benchmark
    from stare_lab.tasks import build_task

    task = build_task({"name": "arithmetic", "train_size": 8, "heldout_size": 7, "seed": 0})
    records, verifier, _ = _benchmark("arithmetic", task)
    return records[:7], verifier


def _evaluate(out_dir: str, n: int, batch_size: int) -> dict:
    import torch

    from stare_lab.evaluation import evaluate_benchmark
    from stare_lab.models import load_model_and_tokenizer

    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer("builtin")
    records, verifier = _records()
    return evaluate_benchmark(
        model,
        tok,
        verifier,
        records,
        n=n,
        temperature=1.0,
        top_p=0.9,
        max_tokens=6,
        batch_size=batch_size,
        seed=3,
        out_dir=out_dir,
        step=1,
        name="arithmetic",
    )


def _rank(rank: int, port: int, out_dir: str, results) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        out = []
        for n, batch_size in SETTINGS:
            result = _evaluate(out_dir, n, batch_size)
            out.append((result["settings_key"], result["metrics"]))
        results[rank] = out
    finally:
        dist.destroy_process_group()


def test_units_cover_every_sample_once():
    for problems, n, batch in [(7, 4, 8), (7, 5, 2), (1, 32, 1024), (3, 1, 1)]:
        jobs = [job for unit in sample_units(problems, n, batch) for b in unit for job in b]
        assert sorted(jobs) == [(i, j) for i in range(problems) for j in range(n)]
        assert all(len(b) <= batch for unit in sample_units(problems, n, batch) for b in unit)


def test_two_process_evaluation_equals_one_process(tmp_path):
    single = {}
    for n, batch_size in SETTINGS:
        r = _evaluate(str(tmp_path / "one"), n, batch_size)
        single[r["settings_key"]] = r["metrics"]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_rank, args=(_free_port(), str(tmp_path / "two"), results), nprocs=2, join=True)
    assert [k for k, _ in results[0]] == [k for k, _ in results[1]] == list(single)
    for key, metrics in results[0]:
        assert metrics == single[key] == dict(results[1])[key]  # avg@n, pass@k, maj@n
        one = pd.read_parquet(tmp_path / "one" / "eval" / "arithmetic" / f"{key}.parquet")
        two = pd.read_parquet(tmp_path / "two" / "eval" / "arithmetic" / f"{key}.parquet")
        pd.testing.assert_frame_equal(one, two)  # every sample, in order
        n = int(key.split("_n")[1].split("_")[0])
        assert len(one) == 7 * n and one["answer"].nunique() > 1  # sampled, not all identical
