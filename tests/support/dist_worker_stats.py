"""Helpers for the multi-process tests: spawn N gloo processes on CPU, and the batches they share.

`spawn(fn, world_size, tmp_dir, *args)` starts `world_size` processes (torch.multiprocessing,
start method "spawn", one torch thread each, rendezvous through a file in tmp_dir, a 120 s gloo
timeout so a lost rank fails the test instead of hanging it) and runs `fn(rank, world_size,
out_dir, *args)` in each. Workers write their results with torch.save under out_dir; the test
reads them. Every worker also computes the one-process reference itself, with the same thread
count, so the comparison is bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stare_lab.stats import TokenStats

GLOO_TIMEOUT_S = 120


def spawn(fn, world_size: int, tmp_dir: Path, *args) -> None:
    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    # FileStore needs a file no earlier group used: a fresh name per call
    init_file = Path(tempfile.mkdtemp(prefix="rdzv-", dir=tmp_dir)) / "store"
    mp.start_processes(
        _entry,
        args=(fn, world_size, str(init_file), str(tmp_dir), args),
        nprocs=world_size,
        join=True,
        start_method="spawn",
    )


def _entry(rank: int, fn, world_size: int, init_file: str, out_dir: str, args) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=GLOO_TIMEOUT_S),
    )
    try:
        fn(rank, world_size, Path(out_dir), *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


# ---- a global generation batch and each rank's share of it ------------------------------------


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    rows_per_rank: tuple[int, ...]  # B_local of each rank (TRL: all equal)
    G: int  # rollouts per prompt
    T: int  # longest completion of the global batch
    old_logp_alias: bool = False  # old_logp is logp (TRL computed no old log-probs)
    token_advantages: bool = False  # advantages [B, T] instead of [B]
    logp_nan: bool = False  # logp all NaN (no declared statistic yields it)


def make_global_batch(spec: BatchSpec, seed: int) -> tuple[TokenStats, torch.Tensor]:
    """The one-process TokenStats of a generation batch, and each row's completion length [B].

    Rows right-padded: completion lengths 1..T (the longest row is T), some rows fully masked
    (TRL's mask_truncated_completions), all-equal-reward groups (advantage 0), padding full of
    huge values (a rule that reads padding differs between 1 and N processes and fails the test).
    """
    g = torch.Generator().manual_seed(seed)
    B, T, G = sum(spec.rows_per_rank), spec.T, spec.G
    assert B % G == 0
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[-1] = T
    lengths[: spec.rows_per_rank[0]] = lengths[: spec.rows_per_rank[0]].clamp(max=max(1, T - 3))  # rank 0 shorter
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    mask[torch.rand(B, generator=g) < 0.1] = 0.0
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    rewards[:G] = 1.0  # group 0: zero variance
    if B // G > 2:
        rewards[2 * G : 3 * G] = 0.0  # group 2: zero variance
    r = rewards.view(-1, G)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    if spec.token_advantages:
        adv = adv[:, None] * (0.5 + torch.rand(B, T, generator=g))
    pad = lengths[:, None] <= torch.arange(T)[None, :]

    def stat(lo: float, hi: float) -> torch.Tensor:
        x = lo + (hi - lo) * torch.rand(B, T, generator=g)
        return torch.where(pad, torch.full_like(x, 1e4), x)

    logp = stat(-6.0, 0.0)
    logp = torch.where(torch.rand(B, T, generator=g) < 0.05, torch.full_like(logp, -8.0), logp)  # rare tokens
    entropy = stat(0.0, 2.0)
    entropy[0, 0] = 0.0
    p2 = stat(0.05, 1.0)
    fields = dict(
        logp=torch.full((B, T), float("nan")) if spec.logp_nan else logp,
        mask=mask,
        advantages=adv,
        group=torch.arange(B) // G,
        entropy=entropy,
        attn_entropy=stat(0.0, 1.0),
        js=stat(0.0, math.log(2.0)),
        p2=p2,
        p2logp=p2 * stat(-4.0, 0.0),
        ref_logp=logp + 0.1 * stat(-1.0, 1.0),
    )
    fields["old_logp"] = fields["logp"] if spec.old_logp_alias else logp + 0.3 * stat(-1.0, 1.0)
    names = {f.name for f in dataclasses.fields(TokenStats)}
    return TokenStats(**{k: v for k, v in fields.items() if k in names}), lengths


def rank_rows(spec: BatchSpec, rank: int) -> slice:
    start = sum(spec.rows_per_rank[:rank])
    return slice(start, start + spec.rows_per_rank[rank])


def local_share(stats: TokenStats, lengths: torch.Tensor, rows: slice) -> TokenStats:
    """A rank's TokenStats: its rows, padded only to its own longest completion (as TRL pads per rank)."""
    T_r = int(lengths[rows].max())
    out = {}
    for f in dataclasses.fields(TokenStats):
        x = getattr(stats, f.name)
        if isinstance(x, torch.Tensor):
            x = x[rows, :T_r].clone() if x.dim() == 2 else x[rows].clone()
        out[f.name] = x
    if stats.old_logp is stats.logp:
        out["old_logp"] = out["logp"]
    return TokenStats(**out)


# ---- rules: 1 process vs N processes -----------------------------------------------------------

SPECS = {
    # TRL's layout: equal rows per rank, G=4, B_local=6, so group 1 (rows 4-7) spans both ranks
    "trl_split": BatchSpec(rows_per_rank=(6, 6), G=4, T=9),
    # unequal shares, old_logp aliased to logp, token-level advantages, a group split 1:3
    "uneven_alias": BatchSpec(rows_per_rank=(5, 7), G=4, T=7, old_logp_alias=True, token_advantages=True),
    # logp all NaN (a rule that declared no statistic yielding it), G=8 spanning both ranks
    "nan_logp": BatchSpec(rows_per_rank=(4, 12), G=8, T=6, old_logp_alias=True, logp_nan=True),
}
GENERIC_VARIANTS = {"scope": ("batch", "group", "sequence"), "ties": ("quantile",)}
EXTRA_VARIANTS = {
    "random": [{"match": "position"}, {"match": "position", "reference": "top_entropy"}],
    "stare": [
        {"H_tgt": 5.0},
        {"variant": "C2", "H_tgt": 5.0},
        {"adaptive": True, "H_tgt": 1.0},
        {"adaptive": True, "variant": "C2", "H_tgt": 0.9},
    ],
    "opefo": [{"flow": "full"}],
    "ict": [{"warmup_steps": 1}, {"warmup_steps": 0}],
    "gmts": [{"mode": "zero_advantage"}, {"rho": 0.5}],
    "rsi_band": [{"low": 0.0, "high": "inf"}, {"low": 1.0, "high": 3.0}],
    "attn_soft": [{"kappa": 1.0}],
    "stapo": [{"tau_p": 0.5, "tau_h_quantile": 0.8}],
    "top_entropy": [{"rho": 0.5}],
}
STEPS = 3  # consecutive generation batches: STARE's adaptive W/M and ICT's warm-up carry over


def rule_variants() -> list[tuple[str, dict]]:
    """Every registered rule with its defaults, plus variants that exercise scope, ties and rule options."""
    from stare_lab.methods import get_method, list_methods, method_params

    out = []
    for name in list_methods():
        fields = {f.name for f in dataclasses.fields(method_params(name))}
        variants = [{}] + [{k: v} for k, vals in GENERIC_VARIANTS.items() if k in fields for v in vals]
        variants += [v for v in EXTRA_VARIANTS.get(name, []) if set(v) <= fields]
        seen = []
        for params in variants:
            try:
                configured = get_method(name, **params).params
            except ValueError:
                continue  # a combination the rule refuses (e.g. a scope it does not support)
            if configured not in seen:  # e.g. scope="batch" where batch is the default
                seen.append(configured)
                out.append((name, params))
    return out


def rule_state(G: int):
    from stare_lab.methods import RuleState

    state = RuleState(step=0, total_steps=STEPS, seed=11)
    try:
        from stare_lab.methods import TrainerValues
    except ImportError:
        return state
    state.trainer = TrainerValues(epsilon_low=0.2, epsilon_high=0.28, beta=0.04, loss_type="dapo", num_generations=G)
    return state


def _out_record(out, rows=None):
    """What a rule returned, restricted to this rank's rows (rows: a RowSlice) when given."""
    from stare_lab.signals.distributed import local_rows

    def part(x):
        return None if x is None else (local_rows(x, rows) if rows is not None else x).clone()

    return {
        "weights": part(out.weights),
        "selected": part(out.selected),
        "normalize": out.normalize,
        "metrics": dict(out.metrics),
        "weight_total": out.weights.sum(),
    }


def rules_worker(rank: int, world_size: int, out_dir: Path) -> None:
    """For every rule variant and batch spec: the rule on the gathered global batch (this rank's rows)
    and on the one-process batch (the reference), over STEPS consecutive batches."""
    from stare_lab.methods import get_method
    from stare_lab.signals.distributed import deterministic, global_token_stats, same_on_all_ranks

    results = {}
    for spec_name, spec in SPECS.items():
        rows = rank_rows(spec, rank)
        batches = [make_global_batch(spec, seed=100 * s + 7) for s in range(STEPS)]
        gathered = []
        for stats, lengths in batches:
            g, row_slice = global_token_stats(local_share(stats, lengths, rows))
            gathered.append((g, row_slice))
            results[(spec_name, "stats", len(gathered) - 1)] = {
                "global": {f.name: getattr(g, f.name) for f in dataclasses.fields(TokenStats)},
                "row_slice": row_slice,
                "old_logp_is_logp": g.old_logp is g.logp,
            }
        for name, params in rule_variants():
            rule = get_method(name, **params)
            state_n, state_1 = rule_state(spec.G), rule_state(spec.G)
            for step, ((stats, _), (g, row_slice)) in enumerate(zip(batches, gathered, strict=True)):
                state_n.step = state_1.step = step
                with deterministic():  # as the trainer calls it
                    out_n = rule(g, state_n)
                out_1 = rule(stats, state_1)
                state_local = rule_state(spec.G)  # negative control: the rule on this rank's rows only
                state_local.step = step
                local_only = rule(local_share(stats, batches[step][1], rows), state_local)
                results[(spec_name, name, repr(params), step)] = {
                    "n": _out_record(out_n, row_slice),
                    "one": _out_record(out_1),
                    "local_only_weights": local_only.weights,
                    "rows": rows,
                    "memory_n": dict(state_n.memory),
                    "memory_1": dict(state_1.memory),
                    "identical_on_ranks": same_on_all_ranks(out_n.weights) and same_on_all_ranks(state_n.memory),
                }
    torch.save(results, out_dir / f"rules_rank{rank}.pt")


# ---- JS to the group mean with groups split over ranks ---------------------------------------

JS_SPECS = {
    "trl_split": BatchSpec(rows_per_rank=(6, 6), G=4, T=9),
    "wide_group": BatchSpec(rows_per_rank=(4, 12), G=8, T=6),
}  # group 0 spans both ranks 4:4
JS_H, JS_V, JS_CHUNK = 16, 40, 4


def js_worker(rank: int, world_size: int, out_dir: Path) -> None:
    """JS of this rank's rows: whole local groups locally, split groups through `js_for_split_groups`;
    the reference is the one-process JS of the global batch."""
    import torch.nn.functional as F

    from stare_lab.signals.distributed import global_token_stats, split_rows
    from stare_lab.signals.js import chunked_js_to_group_mean
    from stare_lab.signals.statistics import js_for_split_groups

    results = {}
    for name, spec in JS_SPECS.items():
        stats, lengths = make_global_batch(spec, seed=3)
        g = torch.Generator().manual_seed(5)
        hidden = torch.randn(stats.shape[0], spec.T, JS_H, generator=g)
        weight = torch.randn(JS_V, JS_H, generator=g) * 2.0

        def project(h):
            return F.linear(h, weight)

        live = stats.mask
        reference = chunked_js_to_group_mean(hidden, project, stats.group, live, chunk_positions=JS_CHUNK)
        rows = rank_rows(spec, rank)
        T_r = int(lengths[rows].max())
        h_loc, live_loc, group_loc = hidden[rows, :T_r], live[rows, :T_r], stats.group[rows]
        split = split_rows(group_loc, spec.G)
        js = torch.zeros(live_loc.shape)
        whole = ~split
        if whole.any():
            js[whole] = chunked_js_to_group_mean(
                h_loc[whole], project, group_loc[whole], live_loc[whole], chunk_positions=JS_CHUNK
            )
        js[split] = js_for_split_groups(
            h_loc[split], live_loc[split], group_loc[split], project, chunk_positions=JS_CHUNK
        )
        local = local_share(stats, lengths, rows)
        local.js = js
        gathered, _ = global_token_stats(local)
        naive = chunked_js_to_group_mean(h_loc, project, group_loc, live_loc, chunk_positions=JS_CHUNK)
        results[name] = {
            "js": js,
            "reference": reference[rows, :T_r],
            "split_rows": int(split.sum()),
            "global_js": gathered.js,
            "global_reference": reference,
            "naive": naive,
        }
    torch.save(results, out_dir / f"js_rank{rank}.pt")


# ---- loss and gradients of a tiny model: DDP over 2 ranks vs one process ---------------------

LOSS_CASES = [
    ("dapo", "selected", "top_entropy"),
    ("dapo", "valid", "stare"),
    ("grpo", "selected", "top_entropy"),
    ("grpo", "valid", "opefo"),
]
PROMPT_LEN = 5


def _tiny_model():
    from fixtures_trainer import tiny_lm

    return tiny_lm()[1]


def _token_logp(model, prompt, completion, mask):
    """[B, T] log π(a_t) of each completion token under `model` (a plain forward, float32)."""
    ids = torch.cat([prompt, completion], dim=1)
    attn = torch.cat([torch.ones_like(prompt), mask.long()], dim=1)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, PROMPT_LEN - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)


def _loss(model, prompt, completion, stats, weights, agg, normalize, num_items, weight_total):
    from stare_lab.training import objective

    logp = _token_logp(model, prompt, completion, stats.mask)
    per_token, _ = objective.clipped_surrogate(logp, logp.detach(), stats.advantages, 0.2, 0.28)
    return objective.aggregate(
        per_token, weights, stats.mask, agg, normalize=normalize, num_items=num_items, weight_total=weight_total
    )


def loss_worker(rank: int, world_size: int, out_dir: Path) -> None:
    """Per rank: its rows, weights from the rule on the gathered batch, DDP's averaged gradient.
    Reference (every rank): the one-process loss and gradient on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stare_lab.methods import get_method
    from stare_lab.signals.distributed import global_token_stats, local_rows
    from stare_lab.training import objective

    spec = SPECS["trl_split"]
    stats, lengths = make_global_batch(spec, seed=21)
    B, T = stats.shape
    g = torch.Generator().manual_seed(8)
    vocab = _tiny_model().config.vocab_size
    prompt = torch.randint(3, vocab, (B, PROMPT_LEN), generator=g)
    completion = torch.randint(3, vocab, (B, T), generator=g)
    rows = rank_rows(spec, rank)
    results = {}
    for loss_type, normalize, rule_name in LOSS_CASES:
        rule = get_method(rule_name, normalize=normalize)
        state = rule_state(spec.G)
        w_one = rule(stats, state).weights
        one = _tiny_model()
        agg_one = objective.Aggregation(loss_type=loss_type, num_processes=1)
        loss_one = _loss(one, prompt, completion, stats, w_one, agg_one, normalize, stats.mask.sum(), w_one.sum())
        loss_one.backward()

        local = local_share(stats, lengths, rows)
        gstats, row_slice = global_token_stats(local)
        out = rule(gstats, rule_state(spec.G))
        w_local = local_rows(out.weights, row_slice)
        num_items = gstats.mask.sum()  # TRL: gather(completion_mask.sum()).sum()
        weight_total = out.weights.sum()  # the generation batch's weight sum, from the global weights
        model = DDP(_tiny_model())
        agg = objective.Aggregation(loss_type=loss_type, num_processes=world_size)
        T_r = local.shape[1]
        loss = _loss(
            model, prompt[rows], completion[rows, :T_r], local, w_local, agg, normalize, num_items, weight_total
        )
        loss.backward()  # DDP averages the gradients over ranks
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        results[(loss_type, normalize, rule_name)] = {
            "loss_one": loss_one.detach(),
            "loss_mean_over_ranks": mean_loss / world_size,
            "grads_one": [p.grad.clone() for p in one.parameters()],
            "grads_ddp": [p.grad.clone() for p in model.module.parameters()],
            "weight_total_one": w_one.sum(),
            "weight_total": weight_total,
        }
    torch.save(results, out_dir / f"loss_rank{rank}.pt")


# ---- bad input: one clear error on every rank, no hang ---------------------------------------


def errors_worker(rank: int, world_size: int, out_dir: Path) -> None:
    from stare_lab.signals.distributed import global_token_stats

    spec = SPECS["trl_split"]
    stats, lengths = make_global_batch(spec, seed=1)
    errors = {}
    local = local_share(stats, lengths, rank_rows(spec, rank))
    per_rank_ids = dataclasses.replace(local, group=torch.arange(local.shape[0]) // spec.G)  # forgot the offset
    missing = dataclasses.replace(local, entropy=None if rank == 1 else local.entropy)
    for name, bad in (("group_layout", per_rank_ids), ("missing_field", missing)):
        try:
            global_token_stats(bad)
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    torch.save(errors, out_dir / f"errors_rank{rank}.pt")


def all_workers(rank: int, world_size: int, out_dir: Path) -> None:
    """Everything the tests need, in one spawn: importing torch and transformers twice per test is
    most of the time on a 2-core machine."""
    for worker in (rules_worker, js_worker, loss_worker, errors_worker):
        worker(rank, world_size, out_dir)
        dist.barrier()
