"""2 processes train like 1 process over the same global generation batches (built-in model, CPU, gloo).

Completions come from a deterministic `rollout_func` (tests/support/dist_worker_train.py), so both runs
see the same 2 generation batches of 12 rows (G = 4; 6 rows per rank, group 1 split over the
ranks), with 2 micro-batches per rank per step. After 2 optimizer steps the parameters must agree
to 1e-6 (absolute; parameters are O(0.1-1)): float32 gradient sums run over other row partitions
and DDP's all-reduce, a few ulps apart, and SGD moves parameters by lr × gradient, so the runs
differ by ~lr·1e-7. Adam is not used here: its first steps are close to lr·sign(gradient), which
turns ulp-level noise on near-zero gradient entries into differences of order lr.

Plain TRL, rule `full`, and the rules that read the batch (top_entropy, gmts, STARE with its gate
open): the trainer computes statistics and weights on the global batch (docs/distributed.md §4).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_worker_train import RUNS, train, train_worker
from dist_worker_trl import spawn_env

WORLD = 2
ATOL = 1e-6

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    spawn_env(train_worker, WORLD, out)
    two = [torch.load(out / f"train_rank{r}.pt", weights_only=False) for r in range(WORLD)]
    one = {(rule, repr(params)): train(rule, out / "one", 1, **params) for rule, params in RUNS}
    from transformers import Qwen2ForCausalLM

    from stare_lab.models.builtin import BUILTIN_DIR

    init = [p.detach() for p in Qwen2ForCausalLM.from_pretrained(BUILTIN_DIR).parameters()]
    return one, two, init, out


@pytest.mark.parametrize("rule,params", [pytest.param(rule, params, id=str(rule)) for rule, params in RUNS])
def test_two_processes_train_like_one(runs, rule, params):
    one, two, init, _ = runs
    key = (rule, repr(params))
    for a, b in zip(two[0][key], two[1][key], strict=True):
        assert torch.equal(a, b)  # DDP keeps the ranks identical
    moved = max((p - p0).abs().max().item() for p, p0 in zip(one[key], init, strict=True))
    assert moved > 1e-3, "two SGD steps must move the parameters"
    diff = max((p1 - p2).abs().max().item() for p1, p2 in zip(one[key], two[0][key], strict=True))
    assert diff <= ATOL, f"{rule}: parameters differ by {diff:.3g} between 1 and 2 processes"


def test_kept_batches_hold_the_global_batch_and_reproduce_its_weights(runs):
    """ict keeps every step: the 2-process record is the 1-process record (the global batch), and the
    run's rule applied to it gives the weights it trained with."""
    from stare_lab.viewer import kept_steps, load_batch
    from stare_lab.viewer.selection import apply_rule

    dirs = {1: Path(runs[3]) / "one" / "kept-1", 2: Path(runs[3]) / "kept-2"}
    assert kept_steps(dirs[1]) == kept_steps(dirs[2]) == [0, 1]
    for step in (0, 1):
        one, two = (load_batch(dirs[n] / "batches" / f"step-{step}.safetensors") for n in (1, 2))
        assert two.completion_ids.shape == one.completion_ids.shape == (12, one.completion_ids.size(1))
        assert torch.equal(one.completion_ids, two.completion_ids) and torch.equal(one.mask, two.mask)
        assert torch.equal(one.group, two.group)
        assert set(one.stats) == set(two.stats)
        for name in one.stats:  # behind a completion's end each layout leaves its own values: rules never read them
            assert torch.allclose(one.stats[name] * one.mask, two.stats[name] * two.mask, atol=1e-5), name
        assert torch.equal(one.trained_weights, two.trained_weights)
        own = apply_rule(two, "ict", two.run_rule["params"], own=True)
        assert torch.equal(own.weights, two.trained_weights.float())
