"""The kept generation batch: one safetensors file per kept step, `<run_dir>/batches/step-<N>.safetensors`.

Tensors (docs/viewer.md has the full table):
    completion_ids int32 [B, T]   mask uint8 [B, T]   group int32 [B]
    rewards float32 [B]           advantages float32 [B] or [B, T]
    prompt_ids int32 [B, P], prompt_mask uint8 [B, P]   (optional)
    stat/<name> float32 [B, T]    (logp, entropy, attn_entropy, js, p2, p2logp, old_logp, ref_logp, ...)
    trained_weights float32 [B, T] (optional: the weights the trainer used on this batch)
Strings and small values (prompts, the text piece of every token id used, the run's rule, the rule
state before the rule ran, meta) are one JSON document in the safetensors header metadata under
`stare_lab_batch`.

The training loss's record (a rule that chooses its tokens in the loss, scope "microbatch" or "token",
or changes the loss): for every completed pass `u` of the loss over the batch (TRL's num_iterations),
    loss/<u>/logp, loss/<u>/entropy float32 [B, T]   the training forward's statistics (detached)
    loss/<u>/weights float32 [B, T]                  the rule's weights in the loss
    loss/<u>/selected uint8 [B, T]                   the rule's selected set there
    loss/<u>/touched/<k> uint8 [B, T]                a loss-changing rule's k-th `LossTerms.touched` set
    loss/<u>/micro_batch, loss/<u>/position int32 [B]  the micro-batch each row was in, its place there
and once: loss/process int32 [B] (the rank of each row), loss/old_logp, loss/ref_logp float32 [B, T]
(TRL's π_old and reference log-probs where the loss had them); the header's "loss" names the touched
sets and holds the per-micro-batch metrics, the optimizer step of each micro-batch and the set-up.

Precision: statistics are stored as float32, exactly the values the trainer computed, so every rule
gives on the loaded batch the weights it gave (or would have given) during training; float16
would move top-k boundaries of ties-sensitive rules. A 64 × 1k batch with every statistic is ~3 MB.

Attention entropy depends on the layers: the key `attn_entropy` holds the layers listed in
`meta["attn_layers"]` (resolved indices, or null when unknown); other layer sets are stored as
`attn_entropy@3,5`. `Batch.token_stats(layers)` picks the one a rule reads.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from stare_lab.record import CONFIG_FILE, code_version, first_line, read_status
from stare_lab.stats import TokenStats

if TYPE_CHECKING:  # annotations only: the viewer's refusals (no batch kept) must not import torch
    import torch
    from torch import Tensor

BATCH_DIR = "batches"
FORMAT = "stare_lab.batch/1"
META_KEY = "stare_lab_batch"
ATTN = "attn_entropy"
_STEP_FILE = re.compile(r"^step-(\d+)\.safetensors$")
# TokenStats fields a batch may carry besides logp (attention entropy is resolved by layers).
STAT_FIELDS = ("entropy", "js", "old_logp", "ref_logp", "p2", "p2logp")


class BatchError(ValueError):
    """A kept batch that is missing or unreadable; the message is one line for the user."""


def batch_path(run_dir: Path | str, step: int) -> Path:
    return Path(run_dir) / BATCH_DIR / f"step-{int(step)}.safetensors"


def kept_steps(run_dir: Path | str) -> list[int]:
    """Steps with a kept batch file in `run_dir`, ascending."""
    folder = Path(run_dir) / BATCH_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))


def attn_key(layers: tuple[int, ...] | None) -> str:
    return ATTN if layers is None else f"{ATTN}@{','.join(str(int(layer)) for layer in layers)}"


@dataclass
class Update:
    """One pass of the training loss over the kept batch (the loss's record, module docstring)."""

    index: int  # 0-based: TRL's iteration over the generation batch
    logp: Tensor  # [B, T] float32, the training forward's log π (at the sampling temperature)
    entropy: Tensor  # [B, T] float32, its entropy
    weights: Tensor  # [B, T] float32, the rule's weights in the loss
    selected: Tensor  # [B, T] bool, the rule's selected set in the loss
    micro_batch: Tensor  # [B] long, which micro-batch of the pass each row was in
    position: Tensor  # [B] long, its row in that micro-batch
    touched: dict[str, Tensor] = field(default_factory=dict)  # how → [B, T] bool (LossTerms.touched)
    metrics: list[dict[str, float]] = field(default_factory=list)  # per micro-batch (rank 0's rows)
    steps: list[int] = field(default_factory=list)  # the optimizer step of each micro-batch


@dataclass
class Batch:
    step: int
    completion_ids: Tensor  # [B, T] long
    mask: Tensor  # [B, T] float32
    rewards: Tensor  # [B] float32
    advantages: Tensor  # [B] or [B, T] float32
    group: Tensor  # [B] long
    stats: dict[str, Tensor]  # name -> [B, T] float32 ("logp" always)
    prompts: list[str]  # [B] prompt text of each row
    pieces: dict[int, str]  # token id -> its decoded text
    run_rule: dict[str, Any]  # {"name": str, "params": dict}
    rule_state: dict[str, Any]  # RuleState.to_dict() as it was before the run's rule ran
    meta: dict[str, Any] = field(default_factory=dict)
    trained_weights: Tensor | None = None  # [B, T] float32
    prompt_ids: Tensor | None = None  # [B, P] long
    prompt_mask: Tensor | None = None  # [B, P] float32
    byte_pieces: dict[int, tuple[str, bytes]] = field(default_factory=dict)  # id -> (raw piece, bytes): part
    # of a multi-byte character (byte-level BPE); its text comes from decoding the row (row_texts)
    # the training loss's record (module docstring): empty for a rule that chose its weights at generation
    loss_meta: dict[str, Any] = field(default_factory=dict)
    updates: list[Update] = field(default_factory=list)
    process: Tensor | None = None  # [B] long, the rank of each row (loss record only)
    loss_old_logp: Tensor | None = None  # [B, T] TRL's π_old in the loss, where it had one
    loss_ref_logp: Tensor | None = None  # [B, T] TRL's reference log-probs, where β > 0

    @property
    def records_loss(self) -> bool:
        """The run's rule chose its tokens in the loss or changed it: the kept batch has the loss's record."""
        return bool(self.loss_meta)

    @property
    def shape(self) -> tuple[int, int]:
        B, T = self.completion_ids.shape
        return B, T

    @property
    def lengths(self) -> list[int]:
        return [int(n) for n in self.mask.sum(1).tolist()]

    def token_pieces(self, row: int) -> list[str]:
        """Text of each valid completion token of `row`, in order: the row's bytes decoded as UTF-8 one
        token at a time, so a character split over byte-level tokens is shown at the token that
        completes it (the tokens before it are empty), never as U+FFFD (the page does the same)."""
        ids = self.completion_ids[row][self.mask[row] > 0].tolist()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        texts = [decoder.decode(self.token_bytes(i)) for i in ids]
        if texts:
            texts[-1] += decoder.decode(b"", final=True)  # a character left incomplete at the end
        return texts

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes a token contributes to its row's text."""
        if token_id in self.byte_pieces:
            return self.byte_pieces[token_id][1]
        return self.pieces.get(token_id, f"<{token_id}>").encode("utf-8")

    def token_label(self, token_id: int) -> str:
        """A token's own name where it is shown alone (top tokens): its text, or for part of a
        character its raw piece and bytes, e.g. "ä¸ (e4 b8)"."""
        if token_id in self.byte_pieces:
            raw, data = self.byte_pieces[token_id]
            return f"{raw} ({data.hex(' ')})"
        return self.pieces.get(token_id, f"<{token_id}>")

    def resolve_layers(self, layers: int | tuple[int, ...] | None) -> tuple[int, ...] | None:
        """A rule's attention layers as stored indices (None = the middle layer), or None when unknown."""
        n = self.meta.get("num_layers")
        if n is None:
            return None if layers is None else tuple([layers] if isinstance(layers, int) else layers)
        if layers is None:
            return (int(n) // 2,)
        items = [layers] if isinstance(layers, int) else list(layers)
        return tuple(sorted({layer + n if layer < 0 else layer for layer in items}))

    def attn_for(self, layers: int | tuple[int, ...] | None) -> Tensor | None:
        """The stored attention entropy for a rule's `layers`, or None when it was not kept."""
        want = self.resolve_layers(layers)
        stored = self.meta.get("attn_layers")
        stored = tuple(stored) if stored is not None else None
        if ATTN in self.stats and (stored is None or want is None or want == stored):
            return self.stats[ATTN]
        return self.stats.get(attn_key(want)) if want is not None else None

    def token_stats(self, attn_layers: int | tuple[int, ...] | None = None) -> TokenStats:
        """TokenStats of the batch, with the attention entropy of `attn_layers` (None = the middle layer)."""
        fields = {k: self.stats[k] for k in STAT_FIELDS if k in self.stats}
        return TokenStats(
            logp=self.stats["logp"],
            mask=self.mask,
            advantages=self.advantages,
            group=self.group,
            attn_entropy=self.attn_for(attn_layers),
            **fields,
        )


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t.detach().to("cpu", dtype, copy=True).contiguous()  # copy: no shared storage


def save_batch(
    path: Path | str,
    step: int,
    *,
    completion_ids: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    rewards: Tensor,  # [B]
    advantages: Tensor,  # [B] or [B, T]
    group: Tensor,  # [B]
    stats: dict[str, Tensor],  # name -> [B, T]; "logp" required
    token_pieces: dict[int, str],  # id -> decoded text, for every id in completion_ids
    byte_pieces: dict[int, tuple[str, bytes]] | None = None,  # id -> (raw piece, bytes): collect.token_pieces
    prompts: list[str],  # [B]
    run_rule: dict[str, Any],  # {"name", "params"}
    rule_state: dict[str, Any] | None = None,
    prompt_ids: Tensor | None = None,
    prompt_mask: Tensor | None = None,
    trained_weights: Tensor | None = None,
    meta: dict[str, Any] | None = None,
    loss_record: dict[str, Any] | None = None,  # collect.LossRecord.payload(): the training loss's record
) -> Path:
    """Write one batch record atomically (temp file + rename); returns its path."""
    import torch  # deferred: torch only when a batch is written or read, never for a refusal
    from safetensors.torch import save_file

    B, T = completion_ids.shape
    if "logp" not in stats:
        raise ValueError("save_batch: stats must hold 'logp'")
    if len(prompts) != B:
        raise ValueError(f"save_batch: {len(prompts)} prompts for {B} rows")
    tensors = {
        "completion_ids": _as(completion_ids, torch.int32),
        "mask": _as(mask > 0, torch.uint8),
        "rewards": _as(rewards, torch.float32),
        "advantages": _as(advantages, torch.float32),
        "group": _as(group, torch.int32),
    }
    for name, value in stats.items():
        if value is None:
            continue
        if tuple(value.shape) != (B, T):
            raise ValueError(f"save_batch: stat {name!r} has shape {tuple(value.shape)}, expected {(B, T)}")
        tensors[f"stat/{name}"] = _as(value, torch.float32)
    optional = {
        "prompt_ids": (prompt_ids, torch.int32),
        "prompt_mask": (prompt_mask, torch.uint8),
        "trained_weights": (trained_weights, torch.float32),
    }
    for name, (given, dtype) in optional.items():
        if given is not None:
            tensors[name] = _as(given if name != "prompt_mask" else given > 0, dtype)
    loss_header = _loss_tensors(loss_record, tensors, (B, T)) if loss_record is not None else None
    used = set(completion_ids.reshape(-1).tolist())
    header = {
        "format": FORMAT,
        "step": int(step),
        "prompts": list(prompts),
        "pieces": {str(i): token_pieces.get(i, f"<{i}>") for i in sorted(used)},
        "byte_pieces": {str(i): [raw, data.hex()] for i, (raw, data) in sorted((byte_pieces or {}).items())},
        "run_rule": {"name": str(run_rule["name"]), "params": dict(run_rule.get("params") or {})},
        "rule_state": rule_state or {"step": int(step), "total_steps": 1, "seed": 0, "memory": {}},
        "meta": meta or {},
    }
    if loss_header is not None:
        header["loss"] = loss_header
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(header, default=_jsonable)})
    os.replace(tmp, path)
    return path


def _loss_tensors(record: dict[str, Any], tensors: dict[str, Tensor], shape: tuple[int, int]) -> dict[str, Any]:
    """Put the loss record's tensors into `tensors` (module docstring); returns its header."""
    import torch  # deferred: torch only when a batch is written

    B, T = shape

    def put(name: str, value: Tensor | None, dtype: torch.dtype, want: tuple[int, ...]) -> None:
        if value is None:
            return
        if tuple(value.shape) != want:
            raise ValueError(f"save_batch: {name} has shape {tuple(value.shape)}, expected {want}")
        tensors[name] = _as(value, dtype)

    names: list[str] = list(record["meta"].get("touched", []))
    put("loss/process", record.get("process"), torch.int32, (B,))
    put("loss/old_logp", record.get("old_logp"), torch.float32, (B, T))
    put("loss/ref_logp", record.get("ref_logp"), torch.float32, (B, T))
    updates = []
    for u, update in enumerate(record.get("updates", [])):
        for key in ("logp", "entropy", "weights"):
            put(f"loss/{u}/{key}", update[key], torch.float32, (B, T))
        put(f"loss/{u}/selected", update["selected"], torch.uint8, (B, T))
        put(f"loss/{u}/micro_batch", update["micro_batch"], torch.int32, (B,))
        put(f"loss/{u}/position", update["position"], torch.int32, (B,))
        for how, mask in update.get("touched", {}).items():
            if how not in names:
                names.append(how)
            put(f"loss/{u}/touched/{names.index(how)}", mask, torch.uint8, (B, T))
        updates.append({"metrics": list(update.get("metrics", [])), "steps": [int(s) for s in update.get("steps", [])]})
    return {**record["meta"], "touched": names, "updates": updates}


def _loss_record(header: dict[str, Any], tensors: dict[str, Tensor]) -> list[Update]:
    """The passes of the loss record in a loaded file (module docstring)."""
    names = list(header.get("touched", []))
    out = []
    for u, info in enumerate(header.get("updates", [])):
        touched = {
            how: tensors[f"loss/{u}/touched/{k}"].bool()
            for k, how in enumerate(names)
            if f"loss/{u}/touched/{k}" in tensors
        }
        out.append(
            Update(
                index=u,
                logp=tensors[f"loss/{u}/logp"].float(),
                entropy=tensors[f"loss/{u}/entropy"].float(),
                weights=tensors[f"loss/{u}/weights"].float(),
                selected=tensors[f"loss/{u}/selected"].bool(),
                micro_batch=tensors[f"loss/{u}/micro_batch"].long(),
                position=tensors[f"loss/{u}/position"].long(),
                touched=touched,
                metrics=[dict(m) for m in info.get("metrics", [])],
                steps=[int(s) for s in info.get("steps", [])],
            )
        )
    return out


def _jsonable(value: Any) -> Any:
    import torch  # deferred: called only by save_batch, which has imported torch already

    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return str(value)


def load_batch(path: Path | str) -> Batch:
    """Read a batch record; BatchError (one line) if it is missing, truncated or not a batch record."""
    from safetensors import safe_open  # deferred with torch: reading a batch makes torch tensors

    path = Path(path)
    if not path.is_file():
        raise BatchError(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = json.loads((f.metadata() or {})[META_KEY])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        if header.get("format") != FORMAT:
            raise ValueError(f"format {header.get('format')!r}, expected {FORMAT!r}")
        mask = tensors["mask"].float()
        stats = {k[5:]: v.float() for k, v in tensors.items() if k.startswith("stat/")}
        batch = Batch(
            step=int(header["step"]),
            completion_ids=tensors["completion_ids"].long(),
            mask=mask,
            rewards=tensors["rewards"].float(),
            advantages=tensors["advantages"].float(),
            group=tensors["group"].long(),
            stats=stats,
            prompts=list(header["prompts"]),
            pieces={int(k): v for k, v in header["pieces"].items()},
            byte_pieces={int(k): (raw, bytes.fromhex(h)) for k, (raw, h) in header.get("byte_pieces", {}).items()},
            run_rule=dict(header["run_rule"]),
            rule_state=dict(header["rule_state"]),
            meta=dict(header.get("meta") or {}),
            trained_weights=tensors.get("trained_weights"),
            prompt_ids=tensors["prompt_ids"].long() if "prompt_ids" in tensors else None,
            prompt_mask=tensors["prompt_mask"].float() if "prompt_mask" in tensors else None,
        )
        if "loss" in header:
            loss = dict(header["loss"])
            batch.updates = _loss_record(loss, tensors)
            batch.loss_meta = {k: v for k, v in loss.items() if k != "updates"}
            batch.process = tensors["loss/process"].long() if "loss/process" in tensors else None
            batch.loss_old_logp = tensors["loss/old_logp"].float() if "loss/old_logp" in tensors else None
            batch.loss_ref_logp = tensors["loss/ref_logp"].float() if "loss/ref_logp" in tensors else None
        batch.token_stats()  # checks every shape
    except BatchError:
        raise
    except Exception as err:  # safetensors raises its own error types for torn or foreign files
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise BatchError(f"{path} is not a readable batch record ({type(err).__name__}: {reason})") from None
    return batch


# why_no_batch's answer for a run of 0 steps (`method=base`): nothing is missing, so `plot` says nothing
UNTRAINED = "it trains 0 steps (the untrained model: no generation batch to keep)"


def why_no_batch(run_dir: Path | str, step: int | None = None) -> str:
    """Why `run_dir` has no kept batch (at `step`; None: none at all), read from its record: one clause."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return "it has not started (no run folder yet)"
    steps = kept_steps(run_dir)
    if steps and step is not None:
        return f"step {step} was not kept (kept steps: {_steps_text(steps)})"
    try:
        config = yaml.safe_load((run_dir / CONFIG_FILE).read_text()) or {}
    except (OSError, yaml.YAMLError):
        config = None
    if not isinstance(config, dict):
        return (
            f"it has no readable {CONFIG_FILE}, so it is not a run record "
            "(a run keeps batches with trainer.keep_batches_every > 0)"
        )
    if (config.get("trainer") or {}).get("max_steps") == 0:
        return UNTRAINED
    every = (config.get("trainer") or {}).get("keep_batches_every") or 0
    if not every:
        return "trainer.keep_batches_every is 0: set it to keep batches"
    status = read_status(run_dir) or {}
    state = status.get("state")
    if state in (None, "pending"):
        return f"it has not started (trainer.keep_batches_every={every})"
    if state == "running":
        return f"it is running and has kept none yet (trainer.keep_batches_every={every})"
    if state != "finished":
        error = first_line(status.get("error"))
        return f"it {state} before keeping one" + (f" ({error})" if error else "")
    method = config.get("method") or {}
    scope = (method.get("params") or {}).get("scope")
    rule = f"{method.get('name')}" + (f" (scope {scope})" if scope else "")
    return (
        f"it finished with trainer.keep_batches_every={every} but kept none (rule {rule}, code "
        f"{code_version(status) or 'unrecorded'}); versions before the loss's record kept none for a rule that "
        "chooses its tokens in the loss (scope microbatch or token) or changes the loss: run it again to keep them"
    )


def load_run_batch(run_dir: Path | str, step: int | None = None) -> Batch:
    """The kept batch of `run_dir` at `step` (None = the last kept); BatchError naming the kept steps."""
    run_dir = Path(run_dir)
    steps = kept_steps(run_dir)
    if not steps:
        raise BatchError(
            f"run {run_dir} has no kept batches ({BATCH_DIR}/step-<N>.safetensors): {why_no_batch(run_dir)}"
        )
    if step is None:
        step = steps[-1]
    if step not in steps:
        raise BatchError(f"step {step} was not kept in run {run_dir}; kept steps: {_steps_text(steps)}")
    try:
        return load_batch(batch_path(run_dir, step))
    except BatchError as err:
        raise BatchError(f"{err}; kept steps: {_steps_text(steps)}") from None


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if steps else "none"
