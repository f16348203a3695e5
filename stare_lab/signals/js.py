"""ICT's signal: Jensen-Shannon divergence of each rollout's next-token distribution to its group mean.

ICT (methods/ict.py, arXiv 2606.19771 [secondary]): `P̄_t = mean_j p_j,t` over the rollouts j of
the same prompt that are still generating at position t (live),
`u_i,t = JS(p_i,t ‖ P̄_t) = ½KL(p_i‖M) + ½KL(P̄‖M)`,
`M = ½(p_i + P̄)`, in [0, log 2]. u = 0 where the row is not live and where fewer than two
rollouts are live at t [ours]. All in log space; one group and `chunk_positions` positions at a
time, so a few G×chunk×V buffers are alive, never G×T×V.

Precision [ours]: the logits are projected in the model's dtype, then log-softmax and the JS sums
run in float64 and the result is rounded to float32. Most of a batch sits at the noise floor of
float32 arithmetic here (rollouts of one prompt that agree give JS of 1e-10..1e-7 nats, computed in
float32 with errors of the same size), so float32 sums made the value depend on how a reduction was
vectorised and chunked (the CPU's vector width, `chunk_positions`, the recorder's flush size); in
float64 every chunking gives the same float32 result. ict.py compares the values on a grid.

Layout [ours]: a group's values depend on its own rows only, to the bit, on every CPU kernel set. Its
chunks stop at the group's last position with two live rows (not at the batch's T) and each chunk is
projected from a fresh contiguous copy, so the same rollouts in another batch (padded to another T,
other rows around them, a group split over ranks and completed by `signals.statistics.js_for_split_groups`)
give the projection the same shapes, strides and alignment. The logits of a float32 matrix product
depend on those (tests/signals/test_js_layout.py); `chunk_positions` still changes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_POSITIONS = 64  # positions whose [G, chunk, V] group distributions are held at once

_LOG2 = math.log(2.0)


def group_slices(group: Tensor) -> list[tuple[int, int]]:
    """[(start, end)] of each run of equal ids; rows of one group must be contiguous (stare_lab/stats.py)."""
    g = group.tolist()
    bounds = [0] + [i for i in range(1, len(g)) if g[i] != g[i - 1]] + [len(g)]
    slices = list(zip(bounds[:-1], bounds[1:], strict=True))
    if len({g[s] for s, _ in slices}) != len(slices):
        raise ValueError("js_to_group_mean: rows of one group must be contiguous")
    return slices


def _js_chunk(logp: Tensor, live: Tensor) -> Tensor:
    """logp [G, c, V] float64 log p; live [G, c] bool -> JS [G, c] (garbage where < 2 live)."""
    n_live = live.sum(0)  # [c]
    log_w = torch.where(live, 0.0, float("-inf")).unsqueeze(-1)  # [G, c, 1]
    log_mean = torch.logsumexp(logp + log_w, dim=0) - n_live.clamp(min=1).log().unsqueeze(-1)  # [c, V] log P̄
    log_m = torch.logaddexp(logp, log_mean.unsqueeze(0)) - _LOG2  # [G, c, V] log M
    kl_p = torch.linalg.vecdot(logp.exp(), logp - log_m)  # [G, c] KL(p_i ‖ M)
    kl_mean = torch.linalg.vecdot(log_mean.exp().unsqueeze(0), log_mean.unsqueeze(0) - log_m)  # KL(P̄ ‖ M)
    return (0.5 * (kl_p + kl_mean)).clamp_(0.0, _LOG2)


def _group_extent(live: Tensor) -> int:
    """1 + the last position where at least two of the group's rows are live (0 when there is none).

    The group's chunks cover [0, extent) only: the extent depends on the group's own rows, never on the
    batch's T (another layout of the same rollouts, e.g. a group split over ranks, pads to another T), so
    every chunk has the same shape in every layout and the kernels do the same arithmetic.
    """
    several = (live.sum(0) >= 2).nonzero()
    return int(several[-1]) + 1 if several.numel() else 0


@torch.no_grad()
def chunked_js_to_group_mean(
    hidden: Tensor,  # [B, T, H]
    project: Callable[[Tensor], Tensor],  # [..., H] -> [..., V] logits
    group: Tensor,  # [B] int
    live_mask: Tensor,  # [B, T] 1 where the row still generates (valid completion token)
    *,
    temperature: float = 1.0,
    chunk_positions: int = CHUNK_POSITIONS,
    final_logit_softcapping: float | None = None,
) -> Tensor:
    """Core of `js_to_group_mean` with an arbitrary projection (a weight, or the model's LM head)."""
    if chunk_positions < 1:
        raise ValueError(f"chunk_positions must be >= 1, got {chunk_positions}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, T, _ = hidden.shape
    if group.shape != (B,) or live_mask.shape != (B, T):
        raise ValueError(
            f"js_to_group_mean: group must be [{B}] and live_mask [{B}, {T}], "
            f"got {tuple(group.shape)} and {tuple(live_mask.shape)}"
        )
    live_all = live_mask.bool()
    out = torch.zeros(B, T, dtype=torch.float32, device=hidden.device)
    for r0, r1 in group_slices(group):
        T_g = _group_extent(live_all[r0:r1])
        for s in range(0, T_g, chunk_positions):
            e = min(s + chunk_positions, T_g)
            live = live_all[r0:r1, s:e]  # [G, c]
            several = live.sum(0) >= 2  # [c]
            if not several.any():
                continue
            # a fresh contiguous copy: the projection's kernel (and so the logits' last bits) depends on the
            # strides and alignment of its input, which the batch around the group would otherwise set
            z = project(hidden[r0:r1, s:e].clone(memory_format=torch.contiguous_format)).float()  # [G, c, V]
            if final_logit_softcapping is not None:
                z = torch.tanh(z / final_logit_softcapping).mul_(final_logit_softcapping)
            z = z.double()
            logp = torch.log_softmax(z / temperature if temperature != 1.0 else z, dim=-1)
            del z
            u = _js_chunk(logp, live).float()
            keep = live & several.unsqueeze(0)
            out[r0:r1, s:e] = torch.where(keep, u, torch.zeros_like(u))
    return out


@torch.no_grad()
def js_to_group_mean(
    hidden: Tensor,  # [B, T, H] last hidden states; position t generates token t+1
    lm_head_weight: Tensor,  # [V, H]
    group: Tensor,  # [B] int: prompt index of each row, rows of a group contiguous
    live_mask: Tensor,  # [B, T] 1 where the row is still generating at t
    *,
    temperature: float = 1.0,
    chunk_positions: int = CHUNK_POSITIONS,
    lm_head_bias: Tensor | None = None,
    final_logit_softcapping: float | None = None,
) -> Tensor:
    """[B, T] float32 u_i,t = JS(p_i,t ‖ P̄_t) ∈ [0, log 2] with P̄ over the live rollouts of the group."""

    def project(h: Tensor) -> Tensor:
        return F.linear(h.to(lm_head_weight.dtype), lm_head_weight, lm_head_bias)

    return chunked_js_to_group_mean(
        hidden,
        project,
        group,
        live_mask,
        temperature=temperature,
        chunk_positions=chunk_positions,
        final_logit_softcapping=final_logit_softcapping,
    )
