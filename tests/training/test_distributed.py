"""Global statistics over 2 gloo processes on CPU equal one process over the same generation batch.

One spawn of 2 processes (tests/support/dist_worker_stats.py) computes everything; each worker also
computes the one-process reference with the same thread count, so comparisons are bit for bit.
Layouts: TRL's (B_local = 6, G = 4: group 1 spans both ranks), uneven shares with a group split
1:3, and G = 8 spanning both ranks; rank 0's completions are shorter than rank 1's (TRL pads
each rank to its own longest), and the one-process batch holds huge values in its padding.
"""

from __future__ import annotations

import math

import pytest
import torch
from dist_worker_stats import (
    JS_SPECS,
    LOSS_CASES,
    SPECS,
    STEPS,
    all_workers,
    local_share,
    make_global_batch,
    rank_rows,
    rule_variants,
    spawn,
)

from stare_lab.methods import list_methods
from stare_lab.signals import distributed

WORLD = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    spawn(all_workers, WORLD, out)
    return {
        kind: [torch.load(out / f"{kind}_rank{r}.pt", weights_only=False) for r in range(WORLD)]
        for kind in ("rules", "js", "loss", "errors")
    }


def _same_metrics(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def test_one_process_is_the_identity():
    stats, _ = make_global_batch(SPECS["trl_split"], seed=0)
    g, rows = distributed.global_token_stats(stats)
    assert g is stats and rows == (slice(0, 12), slice(0, stats.shape[1]))
    assert distributed.local_rows(stats.entropy, rows) is stats.entropy
    assert distributed.local_rows(stats.advantages, rows) is stats.advantages
    tensors = {"h": torch.ones(12, 3, 2)}
    full, group, own = distributed.complete_groups(tensors, stats.group)
    assert full is tensors and group is stats.group and own == slice(0, 12)
    assert distributed.same_on_all_ranks(stats.logp)


def test_deterministic_restores_the_global_flag():
    before = torch.are_deterministic_algorithms_enabled()
    with distributed.deterministic():
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.are_deterministic_algorithms_enabled() == before


def test_split_rows_marks_groups_on_several_ranks():
    spec = SPECS["trl_split"]
    group = torch.arange(12) // spec.G
    assert distributed.split_rows(group[rank_rows(spec, 0)], spec.G).tolist() == [False] * 4 + [True] * 2
    assert distributed.split_rows(group[rank_rows(spec, 1)], spec.G).tolist() == [True] * 2 + [False] * 4
    assert not distributed.split_rows(torch.arange(8) // 4, 4).any()


def test_gathered_statistics_equal_the_one_process_batch(results):
    for rank, res in enumerate(results["rules"]):
        for spec_name, spec in SPECS.items():
            for step in range(STEPS):
                rec = res[(spec_name, "stats", step)]
                stats, lengths = make_global_batch(spec, seed=100 * step + 7)
                g = rec["global"]
                assert g["logp"].shape == stats.shape  # padded to the longest over ranks = the 1-process T
                assert rec["row_slice"] == (rank_rows(spec, rank), slice(0, int(lengths[rank_rows(spec, rank)].max())))
                valid = stats.mask > 0
                assert torch.equal(g["mask"], stats.mask) and torch.equal(g["group"], stats.group)
                for name in (
                    "logp",
                    "old_logp",
                    "ref_logp",
                    "entropy",
                    "attn_entropy",
                    "js",
                    "p2",
                    "p2logp",
                    "advantages",
                ):
                    if name not in g:
                        continue
                    got, want = g[name], getattr(stats, name)
                    if want.dim() == 1:
                        assert torch.equal(got, want), name
                    else:
                        assert torch.equal(got[valid], want[valid]) or (
                            spec.logp_nan and name in ("logp", "old_logp") and got.isnan().all()
                        ), (spec_name, name)
                assert rec["old_logp_is_logp"] == spec.old_logp_alias
                # rank 0's rows are shorter: behind its own length the gathered batch holds zeros, not its padding
                r0 = rank_rows(spec, 0)
                T0 = int(lengths[r0].max())
                assert T0 < stats.shape[1] and (g["entropy"][r0, T0:] == 0).all()


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to the bit, NaN where the other is NaN (the "nan_logp" layout gives a rule that reads the
    log-probs it was handed, adv_reweight's π_old, NaN weights on one process and on two alike)."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


@pytest.mark.parametrize("rule", list_methods())
def test_rule_weights_equal_one_process(results, rule):
    """Weights, selection, normalisation, metrics, rule memory and the weight sum of every variant of
    the rule, over 3 consecutive batches, 3 layouts and both ranks: bit-identical to one process."""
    variants = [repr(p) for n, p in rule_variants() if n == rule]
    assert variants
    checked = 0
    for rank, res in enumerate(results["rules"]):
        for spec_name in SPECS:
            for params in variants:
                for step in range(STEPS):
                    rec = res[(spec_name, rule, params, step)]
                    n, one = rec["n"], rec["one"]
                    rows = rec["rows"]
                    T_r = n["weights"].shape[1]
                    where = (rule, spec_name, params, step, rank)
                    assert _bit_equal(n["weights"], one["weights"][rows, :T_r]), where
                    assert (one["weights"][rows, T_r:] == 0).all(), where
                    assert (n["selected"] is None) == (one["selected"] is None), where
                    if n["selected"] is not None:
                        assert torch.equal(n["selected"], one["selected"][rows, :T_r]), where
                    assert n["normalize"] == one["normalize"], where
                    assert _same_metrics(n["metrics"], one["metrics"]), where
                    assert rec["memory_n"] == rec["memory_1"], where
                    assert _bit_equal(n["weight_total"], one["weight_total"]), where
                    assert rec["identical_on_ranks"], where
                    checked += 1
    assert checked == WORLD * len(SPECS) * len(variants) * STEPS


def test_the_comparison_can_fail(results):
    """Negative control: the same rules on each rank's rows alone (today's behaviour) give other weights."""
    differs = set()
    for res in results["rules"]:
        for key, rec in res.items():
            if key[1] == "stats":
                continue
            mine = rec["n"]["weights"]
            if not torch.equal(rec["local_only_weights"], mine):
                differs.add(key[1])
    batch_scope = {
        "random",
        "top_entropy",
        "low_entropy",
        "anchor",
        "explorer",
        "attn_soft",
        "stare",
        "ict",
        "gmts",
        "opefo",
        "stapo",
    }
    assert batch_scope & set(list_methods()) <= differs


def test_stare_adaptive_memory_moves_and_agrees(results):
    res = results["rules"][0]
    adaptive = [p for n, p in rule_variants() if n == "stare" and "adaptive" in repr(p)]
    assert adaptive
    for params in map(repr, adaptive):
        memories = [res[("trl_split", "stare", params, s)]["memory_n"] for s in range(STEPS)]
        assert all(m and m == res[("trl_split", "stare", params, s)]["memory_1"] for s, m in enumerate(memories))
        assert any(m["W"] != 1.1 for m in memories)  # the schedule stepped W away from its start


def test_js_of_split_groups_equals_one_process(results):
    for rank, res in enumerate(results["js"]):
        for name in JS_SPECS:
            rec = res[name]
            assert rec["split_rows"] > 0
            assert torch.equal(rec["js"], rec["reference"]), (name, rank)
            # without the exchange, the split groups' mean distribution is wrong
            assert not torch.allclose(rec["naive"], rec["reference"], atol=1e-3), (name, rank)
            both = (rec["global_reference"] != 0) | (rec["global_js"] != 0)
            assert torch.equal(rec["global_js"][both], rec["global_reference"][both])


@pytest.mark.parametrize("case", LOSS_CASES, ids=["-".join(c) for c in LOSS_CASES])
def test_loss_and_gradients_equal_one_process(results, case):
    """DDP averages per-rank gradients; each rank's loss is scaled for that (objective.Aggregation's
    num_processes), so the averaged gradient is the one-process gradient. Float32 sums over other
    row partitions: tolerance 1e-6 relative to the largest gradient entry."""
    for res in results["loss"]:
        rec = res[case]
        assert torch.equal(rec["weight_total"], rec["weight_total_one"])
        assert torch.allclose(rec["loss_mean_over_ranks"], rec["loss_one"], rtol=1e-6, atol=1e-7)
        scale = max(g.abs().max() for g in rec["grads_one"])
        assert scale > 0
        for g1, gd in zip(rec["grads_one"], rec["grads_ddp"], strict=True):
            assert torch.allclose(gd, g1, rtol=0, atol=1e-6 * float(scale))
    for a, b in zip(results["loss"][0][case]["grads_ddp"], results["loss"][1][case]["grads_ddp"], strict=True):
        assert torch.equal(a, b)


def test_bad_layouts_are_one_clear_error_on_every_rank(results):
    for errors in results["errors"]:
        assert "global prompt indices" in errors["group_layout"]
        assert "TokenStats.entropy was computed on some ranks and not on others" in errors["missing_field"]


def test_local_share_drops_padding_beyond_the_rank():
    spec = SPECS["uneven_alias"]
    stats, lengths = make_global_batch(spec, seed=0)
    local = local_share(stats, lengths, rank_rows(spec, 0))
    assert local.shape[1] == int(lengths[:5].max()) < stats.shape[1]
    assert local.old_logp is local.logp
