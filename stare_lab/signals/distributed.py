"""Global token statistics: with several processes a rule sees the whole generation batch.

TRL 1.16 lays a generation batch out over ranks in rank order: accelerate's `BatchSamplerShard`
hands batch k of every `num_processes` consecutive batches of `RepeatSampler`'s stream to rank k,
and `_generate_and_score_completions` gathers rewards in rank order and keeps
`process_slice = [process_index·B_local, (process_index+1)·B_local)` of the advantages. So

    global row = process_index · B_local + i,    group = global row // G,

and a prompt's G rollouts sit on several ranks whenever B_local is not a multiple of G
(trl_internals, reach 13: a test notices when TRL changes this layout).

`global_token_stats` gathers every tensor field of a rank's `TokenStats` (only the statistics
the trainer computed, i.e. those the rule declared) to every rank, so all ranks hold the same
global `TokenStats`, run the rule once on it, get identical weights and rule state, and keep
their own rows with `local_rows`. One small all-gather of shapes and encodings, then one
all-gather of raw bytes (bit-exact for any dtype, gloo and NCCL alike). Completion lengths differ
per rank (TRL pads each rank's completions to its own longest); the global batch is right-padded
to the longest over ranks, which is the T one process would have, with mask 0 and zeros behind.
A rule never reads padding (its weights there are forced to 0), so the global batch equals the
one-process batch wherever a rule looks (tests/training/test_distributed.py).

`complete_groups` is the only place hidden states cross ranks: JS to the group mean needs every
live rollout's full next-token distribution, so for a group split over ranks each rank receives
the final hidden states of the group's other rows (point-to-point, H values per token instead of
V) and computes the group's JS itself (signals.statistics.js_for_split_groups). docs/distributed.md
has the sizes.

With one process every function is the identity: the single-process path is bit-identical.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from stare_lab.stats import TokenStats

# How a field travels. ALIAS: old_logp is the same tensor as logp (TRL computed no old log-probs).
# NAN: every value is NaN (logp when the rule declared no statistic that yields it).
_TENSOR, _ABSENT, _ALIAS, _NAN = 0, 1, 2, 3
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
_ALIASES = {"old_logp": "logp"}
_ALWAYS = ("logp", "mask", "advantages", "group")


@dataclass(frozen=True)
class Comm:
    """The processes a generation batch is spread over."""

    rank: int
    world_size: int
    group: Any = None  # torch.distributed ProcessGroup; None = the default (world) group


def comm_of(accelerator_or_group: Any = None) -> Comm:
    """A Comm from an accelerate `Accelerator`, a `ProcessGroup`, or None (the default group, if any)."""
    if accelerator_or_group is not None and hasattr(accelerator_or_group, "num_processes"):
        return Comm(int(accelerator_or_group.process_index), int(accelerator_or_group.num_processes))
    if not (dist.is_available() and dist.is_initialized()):
        return Comm(0, 1)
    g = accelerator_or_group
    return Comm(dist.get_rank(g), dist.get_world_size(g), g)


RowSlice = tuple[slice, slice]  # (this rank's rows in the global batch, its own completion columns)


def global_token_stats(local: TokenStats, accelerator_or_group: Any = None) -> tuple[TokenStats, RowSlice]:
    """Every rank's rows in one `TokenStats`, identical on every rank, and this rank's slice of it.

    `local.group` must hold global prompt indices ((process_index·B_local + row) // G). Fields that
    are None stay None; non-tensor fields are kept from this rank. With one process:
    `(local, full slice)`, the very same object.
    """
    comm = comm_of(accelerator_or_group)
    B, T = local.shape
    if comm.world_size == 1:
        return local, (slice(0, B), slice(0, T))
    names = _field_names(local)
    device = local.mask.device
    meta = _all_gather_ints(_encode_meta(local, names), comm, device)  # [world, 2 + 3·fields + 1]
    sizes = [(int(m[0]), int(m[1])) for m in meta]
    plan = _agree(meta, names)
    sent = [f for f in plan if f.code == _TENSOR]
    payload = [_raw(_wire(getattr(local, f.name), f)) for f in sent]
    nbytes = [sum(_nbytes(f, b, t) for f in sent) for b, t in sizes]
    parts = _all_gather_bytes(
        torch.cat(payload) if payload else torch.zeros(0, dtype=torch.uint8, device=device), nbytes, comm
    )
    rows, T_max = sum(b for b, _ in sizes), max(t for _, t in sizes)
    fields: dict[str, Any] = {f.name: getattr(local, f.name) for f in dataclasses.fields(TokenStats)}
    unpacked = [_unpack(part, sent, b, t, T_max) for part, (b, t) in zip(parts, sizes, strict=True)]
    for f in plan:
        if f.code == _ABSENT:
            fields[f.name] = None
        elif f.code == _NAN:
            fields[f.name] = torch.full((rows, T_max), float("nan"), dtype=f.dtype, device=device)
        elif f.code == _TENSOR:
            fields[f.name] = torch.cat([u[f.name] for u in unpacked])
    for f in plan:
        if f.code == _ALIAS:
            fields[f.name] = fields[_ALIASES[f.name]]
    fields["mask"] = fields["mask"].to(local.mask.dtype)
    _check_group_layout(fields["group"])
    start = sum(b for b, _ in sizes[: comm.rank])
    return TokenStats(**fields), (slice(start, start + B), slice(0, T))


def payload_bytes(local: TokenStats) -> int:
    """Bytes this rank puts on the wire in `global_token_stats` (shapes and encodings, then packed
    statistics), when the other ranks take the same shortcuts (alias, all-NaN) it does."""
    names = _field_names(local)
    meta = _encode_meta(local, names)
    B, T = local.shape
    sent = [
        _Field(n, _TENSOR, torch.uint8 if n == "mask" else getattr(local, n).dtype, getattr(local, n).dim())
        for n in names
        if _local_code(local, n) == _TENSOR
    ]
    return meta.numel() * meta.element_size() + sum(_nbytes(f, B, T) for f in sent)


def local_rows(x: Tensor, row_slice: RowSlice) -> Tensor:
    """This rank's part of a global [B, T] (or [B]) tensor, un-padded to its own completion length."""
    rows, cols = row_slice
    if x.dim() == 1:
        return x if (rows.start == 0 and rows.stop == x.size(0)) else x[rows]
    if rows.start == 0 and rows.stop == x.size(0) and cols.stop == x.size(1):
        return x
    return x[rows, cols].contiguous()


# ---- JS to the group mean when a group spans ranks -------------------------------------------


def complete_groups(
    tensors: dict[str, Tensor], group: Tensor, accelerator_or_group: Any = None
) -> tuple[dict[str, Tensor], Tensor, slice]:
    """Add to this rank's rows the other ranks' rows of the groups this rank holds part of.

    tensors: {name: [B_local, T_local, ...]} (e.g. final hidden states [B, T, H] and the live mask
    [B, T]); group: [B_local] global prompt indices. Returns the tensors over the completed groups
    (rows in global order, right-padded with zeros to the longest completion over ranks), their
    group ids, and the slice of this rank's own rows in them. Only rows of split groups travel,
    point-to-point between the ranks that share the group. Nothing travels when no group is split
    (B_local a multiple of G), beyond one all-gather of [B] group ids. With NCCL the tensors must
    be on this rank's GPU (they are: hidden states of the statistics forward).
    """
    comm = comm_of(accelerator_or_group)
    B = group.numel()
    if comm.world_size == 1:
        return tensors, group, slice(0, B)
    T = next(iter(tensors.values())).size(1) if tensors else 0
    groups, T_max = _gather_group_ids(group, T, comm)  # [B_r] ids of every rank
    ops: list[dist.P2POp] = []
    received: dict[tuple[int, str], Tensor] = {}  # (peer, name) -> the peer's rows of the groups we share
    peer_groups: dict[int, Tensor] = {}  # peer -> the group ids of those rows (peers that share a group)
    for peer in range(comm.world_size):
        if peer == comm.rank:
            continue
        send = torch.nonzero(torch.isin(groups[comm.rank], groups[peer])).squeeze(1)  # my rows of shared groups
        recv = torch.nonzero(torch.isin(groups[peer], groups[comm.rank])).squeeze(1)  # the peer's
        for tag, (name, x) in enumerate(tensors.items()):
            if send.numel():
                ops.append(dist.P2POp(dist.isend, _raw(_pad_dim1(x[send.to(x.device)], T_max)), peer, comm.group, tag))
            if recv.numel():
                buf = torch.empty((recv.numel(), T_max, *x.shape[2:]), dtype=x.dtype, device=x.device)
                received[(peer, name)] = buf
                ops.append(dist.P2POp(dist.irecv, _raw(buf), peer, comm.group, tag))
        if recv.numel():
            peer_groups[peer] = groups[peer][recv]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    # rank order is global row order: lower ranks' rows, mine, higher ranks' rows
    before = [p for p in range(comm.rank) if p in peer_groups]
    after = [p for p in range(comm.rank + 1, comm.world_size) if p in peer_groups]
    out = {
        name: torch.cat(
            [received[(p, name)] for p in before] + [_pad_dim1(x, T_max)] + [received[(p, name)] for p in after]
        )
        for name, x in tensors.items()
    }
    full_group = torch.cat(
        [peer_groups[p] for p in before] + [group.to(torch.int64).cpu()] + [peer_groups[p] for p in after]
    ).to(group.device)
    start = sum(peer_groups[p].numel() for p in before)
    return out, full_group, slice(start, start + B)


def _gather_group_ids(group: Tensor, T: int, comm: Comm) -> tuple[list[Tensor], int]:
    """Every rank's [B_r] group ids (on CPU) and the longest completion over ranks."""
    B = group.numel()
    shape = _all_gather_ints(torch.tensor([B, T], dtype=torch.int64), comm, group.device)  # [world, 2]
    padded = torch.full((int(shape[:, 0].max()),), -1, dtype=torch.int64, device=group.device)
    padded[:B] = group.to(torch.int64)
    ids = _all_gather_ints(padded, comm, group.device)  # [world, B_max]
    return [ids[r, : int(shape[r, 0])] for r in range(comm.world_size)], int(shape[:, 1].max())


def split_rows(group: Tensor, num_generations: int) -> Tensor:
    """[B] bool: rows whose group has rows on other ranks too (fewer than G of its rows are here).

    Local and exact: TRL gives every group exactly G rows. Empty when B_local is a multiple of G.
    """
    _, inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
    return counts[inverse] < num_generations


# ---- checks -----------------------------------------------------------------------------------


def same_on_all_ranks(x: Tensor | float | dict, accelerator_or_group: Any = None) -> bool:
    """True when `x` (a tensor, number, or dict of them, e.g. a rule's memory) is bit-identical on every rank."""
    comm = comm_of(accelerator_or_group)
    if comm.world_size == 1:
        return True
    digest = hashlib.sha256(_bytes_of(x)).digest()
    device = x.device if isinstance(x, Tensor) else torch.device("cpu")
    mine = torch.tensor(list(digest), dtype=torch.int64)
    all_digests = _all_gather_ints(mine, comm, device)
    return bool((all_digests == all_digests[0]).all())


@contextmanager
def deterministic() -> Iterator[None]:
    """Run a rule with torch's deterministic kernels, so every rank computes bit-identical weights.

    On CPU the rules' kernels are deterministic already. On CUDA a few are not unless asked
    (`index_add_` accumulates with atomics: OPEFO's per-scope sums), and ranks would then differ
    in the last bits of λ. warn_only: a kernel without a deterministic version warns, never fails.
    """
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _bytes_of(x: Any) -> bytes:
    if isinstance(x, Tensor):
        head = str((tuple(x.shape), x.dtype)).encode()
        return head + _raw(x.detach().cpu()).numpy().tobytes()
    if isinstance(x, dict):
        return b"".join(k.encode() + b"=" + _bytes_of(v) + b";" for k, v in sorted(x.items()))
    return repr(x).encode()


# ---- internals --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    name: str
    code: int  # _TENSOR, _ABSENT, _ALIAS or _NAN, the same on every rank
    dtype: torch.dtype  # as it travels (the mask as uint8)
    ndim: int  # 1: [B], 2: [B, T]


def _field_names(local: TokenStats) -> list[str]:
    """The TokenStats fields that take part: tensors and None; other values stay this rank's own."""
    return [
        f.name
        for f in dataclasses.fields(TokenStats)
        if f.name in _ALWAYS or getattr(local, f.name) is None or isinstance(getattr(local, f.name), Tensor)
    ]


def _encode_meta(local: TokenStats, names: list[str]) -> Tensor:
    """[B, T, (code, dtype index, ndim) per field, mask is 0/1]."""
    meta = list(local.shape)
    for name in names:
        x = getattr(local, name)
        dtype = torch.uint8 if name == "mask" else (x.dtype if x is not None else torch.float32)
        meta += [_local_code(local, name), _DTYPES.index(dtype), x.dim() if x is not None else 2]
    mask = local.mask
    meta.append(int(bool(((mask == 0) | (mask == 1)).all())))
    return torch.tensor(meta, dtype=torch.int64)


def _local_code(local: TokenStats, name: str) -> int:
    x = getattr(local, name)
    if x is None:
        return _ABSENT
    if name in _ALIASES and x is getattr(local, _ALIASES[name]):
        return _ALIAS
    if name not in _ALWAYS[1:] and x.is_floating_point() and x.numel() and bool(torch.isnan(x).all()):
        return _NAN
    return _TENSOR


def _agree(meta: Tensor, names: list[str]) -> list[_Field]:
    """One encoding per field for all ranks: a shortcut (alias, all-NaN) only where every rank takes it."""
    if not bool(meta[:, -1].all()):
        raise ValueError("global_token_stats: TokenStats.mask must be 0/1 on every rank")
    plan = []
    for i, name in enumerate(names):
        code, dtype, ndim = meta[:, 2 + 3 * i], meta[:, 3 + 3 * i], meta[:, 4 + 3 * i]
        absent = code == _ABSENT
        if bool(absent.any()) and not bool(absent.all()):
            raise ValueError(f"global_token_stats: TokenStats.{name} was computed on some ranks and not on others")
        agreed = int(code[0]) if bool((code == code[0]).all()) else _TENSOR
        if agreed != _ABSENT and not (bool((dtype == dtype[0]).all()) and bool((ndim == ndim[0]).all())):
            raise ValueError(f"global_token_stats: TokenStats.{name} differs in dtype or shape between ranks")
        plan.append(_Field(name, agreed, _DTYPES[int(dtype[0])], int(ndim[0])))
    return plan


def _wire(x: Tensor, f: _Field) -> Tensor:
    """The tensor as it travels: the mask as uint8 (one byte a token), the rest as it is."""
    return x.to(f.dtype)


def _nbytes(f: _Field, B: int, T: int) -> int:
    return B * (T if f.ndim == 2 else 1) * torch.empty(0, dtype=f.dtype).element_size()


def _unpack(part: Tensor, sent: list[_Field], B: int, T: int, T_max: int) -> dict[str, Tensor]:
    """One rank's fields out of its packed bytes, [B, T] right-padded with zeros to T_max."""
    out, offset = {}, 0
    for f in sent:
        n = _nbytes(f, B, T)
        x = part[offset : offset + n].clone().view(f.dtype)  # clone: a fresh, aligned storage for the view
        offset += n
        out[f.name] = _pad_dim1(x.reshape(B, T), T_max) if f.ndim == 2 else x.reshape(B)
    return out


def _raw(x: Tensor) -> Tensor:
    """A flat uint8 view of a tensor (bit-exact transport for every dtype)."""
    return x.contiguous().view(torch.uint8).reshape(-1)


def _wire_device(comm: Comm, hint: torch.device) -> torch.device:
    """Where a collective's tensors must live: NCCL takes CUDA tensors only, gloo takes both."""
    if dist.get_backend(comm.group) == "nccl" and hint.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return hint


def _all_gather_ints(x: Tensor, comm: Comm, device: torch.device) -> Tensor:
    x = x.to(_wire_device(comm, device))
    out = [torch.empty_like(x) for _ in range(comm.world_size)]
    dist.all_gather(out, x, group=comm.group)
    return torch.stack(out).cpu()


def _all_gather_bytes(payload: Tensor, nbytes: list[int], comm: Comm) -> list[Tensor]:
    """One all-gather of every rank's packed bytes (padded to the largest); each rank's part."""
    buf = torch.zeros(max(nbytes), dtype=torch.uint8, device=_wire_device(comm, payload.device))
    buf[: payload.numel()] = payload
    out = [torch.empty_like(buf) for _ in range(comm.world_size)]
    dist.all_gather(out, buf, group=comm.group)
    return [o[:n].to(payload.device) for o, n in zip(out, nbytes, strict=True)]


def _pad_dim1(x: Tensor, T_max: int) -> Tensor:
    if x.size(1) == T_max:
        return x
    pad = torch.zeros((x.size(0), T_max - x.size(1), *x.shape[2:]), dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], dim=1)


def _check_group_layout(group: Tensor) -> None:
    """Rows of one prompt must be contiguous in the global batch (global prompt indices, not per rank)."""
    g = group.cpu()
    if g.numel() < 2:
        return
    starts = torch.cat([torch.tensor([True]), g[1:] != g[:-1]])
    if torch.unique(g).numel() != int(starts.sum()):
        raise ValueError(
            "global_token_stats: rows of one group are not contiguous over ranks; TokenStats.group "
            "must hold global prompt indices ((process_index·B_local + row) // G)"
        )


def gather_rows(
    tensors: dict[str, Tensor], accelerator_or_group: Any = None, left_padded: tuple[str, ...] = ()
) -> dict[str, Tensor]:
    """Every rank's rows of each [B_r] or [B_r, T_r, ...] tensor, in rank (= global row) order.

    Dimension 1 is padded with zeros to the longest over ranks: on the right, or on the left for the
    names in `left_padded` (TRL left-pads prompts). Bit-exact (raw bytes). With one process: `tensors`.
    For rarely used records (the viewer's kept batches), not for every step.
    """
    comm = comm_of(accelerator_or_group)
    if comm.world_size == 1:
        return tensors
    out = {}
    for name, x in tensors.items():
        shape = torch.tensor([x.size(0), x.size(1) if x.dim() > 1 else 0], dtype=torch.int64)
        shapes = _all_gather_ints(shape, comm, x.device)  # [world, 2]
        tail = tuple(x.shape[2:])
        inner = torch.Size(tail).numel()  # elements per (row, position); 1 for [B, T]
        nbytes = [b * (t if x.dim() > 1 else 1) * inner * x.element_size() for b, t in shapes.tolist()]
        parts = _all_gather_bytes(_raw(x), nbytes, comm)
        T_max = int(shapes[:, 1].max())
        rows = []
        for part, (b, t) in zip(parts, shapes.tolist(), strict=True):
            y = part.clone().view(x.dtype).reshape(b, *((t,) if x.dim() > 1 else ()), *tail)
            if x.dim() > 1 and t < T_max:
                pad = torch.zeros((b, T_max - t, *tail), dtype=x.dtype, device=y.device)
                y = torch.cat([pad, y] if name in left_padded else [y, pad], dim=1)
            rows.append(y)
        out[name] = torch.cat(rows)
    return out
