"""Settings and helpers shared by the vLLM tests (tests/vllm_tests/conftest.py shares the engine)."""

import math

import numpy as np

from stare_lab.training import vllm_engine

# Small rollouts: 2 prompts × 4 completions per step; every trainer of the session has this batch,
# so the shared engine's max_num_seqs (TRL sets it from the first trainer) fits all of them.
SMALL = [
    "trainer.use_vllm=true",
    "trainer.vllm_gpu_memory_utilization=0.1",
    "trainer.per_device_train_batch_size=8",
    "trainer.num_generations=4",
    "trainer.gradient_accumulation_steps=1",
    "trainer.max_completion_length=20",
    "trainer.learning_rate=1e-3",
    "trainer.save_steps=100",
    "logger=none",
    "eval.enabled=false",
]


def watch_syncs(trainer) -> list[tuple[float, float]]:
    """Wrap TRL's sync: each entry is (max |engine - policy| just before the sync, just after)."""
    gen, seen = trainer.vllm_generation, []
    sync = gen.sync_weights

    def checked_sync():
        before = max(vllm_engine.weight_mismatch(gen.llm, trainer.model).values())
        sync()
        seen.append((before, max(vllm_engine.weight_mismatch(gen.llm, trainer.model).values())))

    gen.sync_weights = checked_sync
    return seen


def paired_z(a, b) -> float:
    """z of the mean per-problem accuracy difference (problems are the independent units: the n samples
    of one problem share its difficulty, so a plain two-proportion test over samples would be too narrow)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    se = d.std(ddof=1) / math.sqrt(len(d))
    return float(d.mean() / se) if se > 0 else 0.0
