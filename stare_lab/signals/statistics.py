"""The statistics pass: the statistics a rule declares, for one generation batch, in one no-grad forward.

`token_statistics` is driven by the table `stare_lab.stats.STATISTICS`: each declared name is
computed from its source.
- "batch": read from TRL's generation batch (`old_per_token_logps`, `ref_per_token_logps`).
- "vocab": from the next-token distribution `softmax(head(h)/τ)` at each completion position,
  `signals/vocab.py`, chunked over positions.
- "group": JS to the group's mean distribution, `signals/js.py`, chunked over positions.
- "attention": attention entropy at the declared layers, `signals/attention.py`.
Every statistic that needs logits goes through ONE projection, `lm_head_of(model)`: the head
module itself (bias, LoRA or any adapter included), Granite's `logits_scaling` and the text
config's `final_logit_softcapping`, so it equals `model(...).logits` (tests/signals/test_lm_head.py).
A batch whose rule declares nothing that needs the model runs no forward at all; a rule that reads
only attention entropy stops the forward after its last layer and builds no logits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stare_lab.signals.distributed import comm_of, complete_groups, split_rows
from stare_lab.stats import STATISTICS, check_known

from .attention import CHUNK_QUERIES, attention_entropy, forward_with_stats, resolve_layers, unwrap_model
from .js import CHUNK_POSITIONS, chunked_js_to_group_mean, group_slices
from .vocab import CHUNK_TOKENS, WANTS, chunked_vocab_stats, lm_head_of

# Computed whenever logits are built anyway (for the trainer's entropy metric), declared or not.
FREE_WITH_LOGITS = ("logp", "entropy")


def check_needs(needs: Iterable[str]) -> frozenset[str]:
    needs = frozenset(needs)
    check_known(needs)
    vocab = {n for n in needs if STATISTICS[n].source == "vocab"} - {"logp"}
    if vocab - set(WANTS):  # a statistic in the table whose computation signals/vocab.py lacks
        raise LookupError(f"no computation for vocab statistics {sorted(vocab - set(WANTS))} in signals/vocab.py")
    return needs


@torch.no_grad()
def token_statistics(
    model,
    batch: Mapping[str, Tensor],  # TRL's generation batch: prompt_ids/mask [B, P], completion_ids/mask [B, T], ...
    needs: Iterable[str],
    *,
    num_generations: int,  # G: rows of one prompt are contiguous groups of G
    temperature: float = 1.0,
    attn_layers: int | Iterable[int] | None = None,  # the rule's layers (None = the middle layer)
    rows_per_forward: int | None = None,  # whole groups per forward (None: the whole batch)
    chunk_tokens: int = CHUNK_TOKENS,
    chunk_queries: int = CHUNK_QUERIES,
    chunk_positions: int = CHUNK_POSITIONS,
    group: Tensor | None = None,  # [B] global prompt index of each row (None: arange(B) // G, one process)
    accelerator=None,  # an accelerate Accelerator or ProcessGroup: JS of groups split over ranks
    given: Mapping[str, Tensor] | None = None,  # statistics another source already computed (generation)
) -> dict[str, Tensor]:
    """{name: [B, T] float32} for every declared statistic, plus `FREE_WITH_LOGITS` when logits were built.

    Position alignment: completion token t is described by input position P + t - 1, the step that
    generated it (docs/pitfalls_signals.md). The multimodal inputs TRL passes to its forward
    (`MULTIMODAL_KEYS`) reach this forward too, sliced per forward like the rows; statistics are
    read at completion positions only. Statistics in `given` (recorded during generation, or taken from
    TRL's old-log-prob forward) are used as they are; the forward runs only for what is still missing.
    With several processes, `group` holds global prompt indices:
    forwards start at group boundaries, and JS of a group whose rows sit on several ranks comes from
    `js_for_split_groups` (every rank calls it once, a collective).
    """
    needs = check_needs(needs)
    given = dict(given or {})
    missing = needs - set(given)
    sources = {STATISTICS[n].source for n in missing}
    out: dict[str, Tensor] = {}
    if sources & {"vocab", "group", "attention"} or (
        "old_logp" in missing and _missing(batch, "old_logp") and "logp" not in given
    ):
        out = _forward_statistics(
            model,
            batch,
            missing,
            num_generations,
            temperature,
            attn_layers,
            rows_per_forward,
            chunk_tokens,
            chunk_queries,
            chunk_positions,
            group,
            accelerator,
        )
    out.update(given)
    for name in needs:
        stat = STATISTICS[name]
        if stat.source != "batch" or name in given:
            continue
        value = batch.get(stat.key) if stat.key is not None else None
        if value is None and name == "old_logp":
            value = out["logp"]  # on-policy: TRL computed no old log-probs, π_old is the rollout policy
        if value is None:
            raise ValueError(
                f"statistic {name!r} needs {stat.key!r} in the generation batch, which TRL did not "
                f"compute ({stat.meaning})"
            )
        out[name] = value.float()
    return out


def _missing(batch: Mapping[str, Tensor], name: str) -> bool:
    key = STATISTICS[name].key
    return key is None or batch.get(key) is None


def row_chunks(group: Tensor, num_generations: int, rows: int) -> list[tuple[int, int, bool]]:
    """[(start, end, split)] row ranges of one forward each: whole groups, at most `rows` rows (at least one
    group); a group with fewer than G rows here (split over ranks) is a chunk of its own, split=True.

    One process (group = arange(B) // G, rows a multiple of G): [0, rows), [rows, 2·rows), ...
    """
    split = split_rows(group, num_generations).tolist()
    out: list[tuple[int, int, bool]] = []
    for s, e in group_slices(group):
        if split[s]:
            out.append((s, e, True))
        elif out and not out[-1][2] and e - out[-1][0] <= rows:
            out[-1] = (out[-1][0], e, False)
        else:
            out.append((s, e, False))
    return out


# The inputs besides ids and mask that TRL 1.16 passes to the policy's forward
# (GRPOTrainer._get_per_token_logps_and_entropies): per row, or per image where noted.
MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "spatial_shapes",
    "num_tiles",
    "image_position_ids",
)


def multimodal_slice(batch: Mapping[str, Any], start: int, end: int) -> dict:
    """The multimodal inputs of rows [start, end), cut exactly as TRL 1.16 cuts them for a forward of those
    rows (`GRPOTrainer._get_per_token_logps_and_entropies`: per image, per tile or per row by model family;
    trl_internals, reach 14)."""
    b: dict[str, Any] = {k: batch.get(k) for k in MULTIMODAL_KEYS}  # tensors, and lists (num_images, num_tiles)
    pixel_values, grid, num_images, num_tiles = b["pixel_values"], b["image_grid_thw"], b["num_images"], b["num_tiles"]
    out: dict = {}
    if num_images is not None:
        cum_imgs = torch.tensor([0] + list(num_images)).cumsum(0)
        img_start, img_end = cum_imgs[start], cum_imgs[end]
    if grid is not None and pixel_values is not None:
        rows_per_sample = torch.stack([s.sum() for s in torch.split(grid.prod(dim=-1), list(num_images))])
        cum_rows = torch.cat([torch.tensor([0], device=rows_per_sample.device), rows_per_sample.cumsum(0)])
        out["pixel_values"] = pixel_values[cum_rows[start].item() : cum_rows[end].item()]
        out["image_grid_thw"] = grid[img_start:img_end]
    elif b["image_position_ids"] is not None and pixel_values is not None:
        out["pixel_values"] = pixel_values[img_start:img_end]
        out["image_position_ids"] = b["image_position_ids"][img_start:img_end]
    elif b["spatial_shapes"] is not None and pixel_values is not None:  # LFM2-VL: tile-indexed
        cum_tiles = torch.tensor([0] + list(num_tiles)).cumsum(0)
        tile_start, tile_end = cum_tiles[start], cum_tiles[end]
        out["pixel_values"] = pixel_values[tile_start:tile_end]
        out["pixel_attention_mask"] = b["pixel_attention_mask"][tile_start:tile_end]
        out["spatial_shapes"] = b["spatial_shapes"][tile_start:tile_end]
    elif num_tiles is not None and pixel_values is not None:  # InternVL: tile-indexed
        cum_tiles = torch.tensor([0] + list(num_tiles)).cumsum(0)
        out["pixel_values"] = pixel_values[cum_tiles[start] : cum_tiles[end]]
    elif pixel_values is not None and num_images is not None and pixel_values.size(0) == sum(num_images):
        out["pixel_values"] = pixel_values[img_start:img_end]
    elif pixel_values is not None:
        out["pixel_values"] = pixel_values[start:end]
    if b["pixel_attention_mask"] is not None and b["spatial_shapes"] is None:
        out["pixel_attention_mask"] = b["pixel_attention_mask"][start:end]
    if b["image_sizes"] is not None:
        out["image_sizes"] = b["image_sizes"][img_start:img_end]
    for key in ("token_type_ids", "mm_token_type_ids"):  # [B, P + T]: the completion part is zeros
        if b[key] is not None:
            out[key] = b[key][start:end]
    return out


@dataclass(frozen=True)
class _Forward:
    """What every forward of one statistics pass shares: the model, its head (None: no logits are built,
    only attention entropy), what the vocabulary reduction returns, the attention layers, the chunk sizes,
    and the prompt and completion lengths P and T."""

    model: Any
    head: Callable[[Tensor], Tensor] | None
    cap: float | None  # the text config's final_logit_softcapping
    want: tuple[str, ...]
    layers: tuple[int, ...] | None
    temperature: float
    chunk_tokens: int
    chunk_queries: int
    chunk_positions: int
    P: int
    T: int


def _forward_statistics(
    model,
    batch,
    needs,
    G,
    temperature,
    attn_layers,
    rows,
    chunk_tokens,
    chunk_queries,
    chunk_positions,
    group=None,
    accelerator=None,
) -> dict[str, Tensor]:
    """What the forward gives, one forward per chunk of whole groups (`row_chunks`): the vocabulary
    statistics and attention entropy of each chunk, JS within each group that sits on this rank, then JS
    of the groups split over ranks (a collective)."""
    completion_ids, mask = batch["completion_ids"], batch["completion_mask"]
    B = completion_ids.size(0)
    rows = rows or B
    if rows % G:
        raise ValueError(f"rows_per_forward={rows} must be a multiple of num_generations={G} (whole groups)")
    if group is None:
        group = torch.arange(B, device=mask.device) // G
    several = comm_of(accelerator).world_size > 1
    build_logits = any(STATISTICS[n].source in ("vocab", "group") for n in needs) or "old_logp" in needs
    head, cap = lm_head_of(model) if build_logits else (None, None)
    fwd = _Forward(
        model=model,
        head=head,
        cap=cap,
        want=tuple(w for w in WANTS if w in needs or w in FREE_WITH_LOGITS),
        layers=resolve_layers(model, attn_layers) if "attn_entropy" in needs else None,
        temperature=temperature,
        chunk_tokens=chunk_tokens,
        chunk_queries=chunk_queries,
        chunk_positions=chunk_positions,
        P=batch["prompt_ids"].size(1),
        T=completion_ids.size(1),
    )
    chunks: dict[str, list[Tensor]] = {}
    split_hidden: list[Tensor] = []  # final hidden states of rows of groups split over ranks (JS)
    split_at: list[tuple[int, int]] = []
    for start, end, split in row_chunks(group, G, rows):
        h, found = _chunk_statistics(fwd, batch, start, end)
        for k, v in found.items():
            chunks.setdefault(k, []).append(v)
        if "js" not in needs or h is None:
            continue
        if split and several:  # its JS comes from the collective below
            split_hidden.append(h)
            split_at.append((start, end))
            chunks.setdefault("js", []).append(torch.zeros(end - start, fwd.T, device=h.device))
        else:
            chunks.setdefault("js", []).append(_js_in_groups(fwd, h, group[start:end], mask[start:end]))
    out = {k: torch.cat(v, dim=0).float() for k, v in chunks.items()}
    if "js" in needs and several:  # every rank calls it, with or without split rows
        _js_of_split_groups(fwd, out, split_hidden, split_at, mask, group, accelerator)
    return out


def _chunk_statistics(fwd: _Forward, batch, start: int, end: int) -> tuple[Tensor | None, dict[str, Tensor]]:
    """One forward of rows [start, end): the final hidden states at the positions that generate each
    completion token (None when no logits are built), and the chunk's vocabulary statistics and attention
    entropy, [end - start, T] each."""
    P, T = fwd.P, fwd.T
    input_ids = torch.cat([batch["prompt_ids"][start:end], batch["completion_ids"][start:end]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"][start:end], batch["completion_mask"][start:end]], dim=1)
    extra = multimodal_slice(batch, start, end)
    if fwd.head is None:  # attention entropy only: stop after the last chosen layer
        ae = attention_entropy(
            fwd.model, input_ids, attention_mask, fwd.layers, fwd.chunk_queries, first_position=P - 1, **extra
        )
        return None, {"attn_entropy": ae[:, P - 1 : P + T - 1]}
    hidden, ae_or_none = forward_with_stats(
        fwd.model,
        input_ids,
        attention_mask,
        ae_layers=fwd.layers,
        chunk_queries=fwd.chunk_queries,
        first_position=P - 1,
        **extra,
    )
    h = hidden[:, P - 1 : P + T - 1]  # the position that generates completion token t
    found = chunked_vocab_stats(
        h,
        fwd.head,
        batch["completion_ids"][start:end],
        temperature=fwd.temperature,
        want=fwd.want,
        chunk_tokens=fwd.chunk_tokens,
        final_logit_softcapping=fwd.cap,
    )
    if ae_or_none is not None:
        found["attn_entropy"] = ae_or_none[:, P - 1 : P + T - 1]
    return h, found


def _js_in_groups(fwd: _Forward, h: Tensor, group: Tensor, mask: Tensor) -> Tensor:
    """[n, T] JS of each row to its group's mean, for rows whose groups all sit in this chunk."""
    assert fwd.head is not None, "hidden states come only from a forward that builds logits"
    return chunked_js_to_group_mean(
        h,
        fwd.head,
        group,
        mask,
        temperature=fwd.temperature,
        chunk_positions=fwd.chunk_positions,
        final_logit_softcapping=fwd.cap,
    )


def _js_of_split_groups(
    fwd: _Forward,
    out: dict[str, Tensor],
    split_hidden: list[Tensor],
    split_at: list[tuple[int, int]],
    mask: Tensor,
    group: Tensor,
    accelerator,
) -> None:
    """JS of this rank's rows of groups split over ranks into `out["js"]` (`js_for_split_groups`,
    a collective every rank joins, with or without such rows)."""
    assert fwd.head is not None, "JS builds logits"
    rows_idx = [r for s, e in split_at for r in range(s, e)]
    H = unwrap_model(fwd.model).config.get_text_config().hidden_size
    hidden = (
        torch.cat(split_hidden)
        if split_hidden
        else torch.zeros(0, fwd.T, H, device=mask.device, dtype=next(fwd.model.parameters()).dtype)
    )
    idx = torch.tensor(rows_idx, dtype=torch.long, device=mask.device)
    js = js_for_split_groups(
        hidden,
        mask[idx],
        group[idx],
        fwd.head,
        accelerator,
        temperature=fwd.temperature,
        chunk_positions=fwd.chunk_positions,
        final_logit_softcapping=fwd.cap,
    )
    if rows_idx:
        out["js"][idx] = js.float()


def js_for_split_groups(
    hidden: Tensor,
    live_mask: Tensor,
    group: Tensor,
    project: Callable[[Tensor], Tensor],
    accelerator_or_group: Any = None,
    **js_kwargs: Any,
) -> Tensor:
    """JS to the group mean [n, T] for this rank's n rows of groups that span ranks.

    hidden [n, T, H] (final hidden states at the positions that generate each completion token),
    live_mask [n, T], group [n] global prompt indices: this rank's rows of split groups
    (`split_rows`), possibly none. Every rank calls it once per generation batch (a collective).
    Each rank receives the hidden states of its split groups' other rows, computes the group's
    P̄ over all live rollouts exactly as one process would, and keeps its own rows.
    js_kwargs: those of `chunked_js_to_group_mean` (temperature, chunk_positions, ...). The hidden states
    cross ranks in `distributed.complete_groups`, which knows nothing of JS (the signals import the
    communication, never the other way round).
    """
    full, full_group, own = complete_groups({"hidden": hidden, "live": live_mask}, group, accelerator_or_group)
    if hidden.size(0) == 0:
        return torch.zeros(live_mask.shape, dtype=torch.float32, device=live_mask.device)
    js = chunked_js_to_group_mean(full["hidden"], project, full_group, full["live"], **js_kwargs)
    return js[own, : hidden.size(1)]
