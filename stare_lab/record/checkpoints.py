"""A run's trainer checkpoints (checkpoints/checkpoint-<step>): which count as saved, which can be
resumed from (each file's structure checked without loading tensors), and the world size that wrote
one, against this process's rank and world size."""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

from stare_lab.record.files import CHECKPOINT_DIR

_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def checkpoint_step(path: Path) -> int:
    match = _CHECKPOINT.fullmatch(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not a checkpoint folder (checkpoint-<step>)")
    return int(match.group(1))


def checkpoints(run_dir: Path | str) -> list[Path]:
    """Trainer checkpoints that count as saved (trainer_state.json present), newest first."""
    found = []
    for d in (Path(run_dir) / CHECKPOINT_DIR).glob("checkpoint-*"):
        if _CHECKPOINT.fullmatch(d.name) and (d / "trainer_state.json").is_file():
            found.append(d)
    return sorted(found, key=checkpoint_step, reverse=True)


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why a checkpoint can not be resumed from (first problem found), or None.

    Checks the structure of each file without loading tensors: JSON parses, a safetensors header
    and its data length match the file size, a torch zip archive has its central directory.
    """
    for f in sorted(Path(ckpt).iterdir()):
        try:
            if f.suffix == ".json":
                json.loads(f.read_text())
            elif f.suffix == ".safetensors":
                _check_safetensors(f)
            elif f.suffix in (".pt", ".pth", ".bin") and f.stat().st_size and not zipfile.is_zipfile(f):
                raise ValueError("not a complete torch archive")
        except (OSError, ValueError) as e:
            return f"{f.name}: {e}"
    return None


def _check_safetensors(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("truncated (no header)")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise ValueError("truncated header")
        header = json.loads(f.read(n))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise ValueError(f"truncated ({size} bytes, {8 + n + end} expected)")


def checkpoint_world_size(ckpt: Path) -> int:
    """Processes that wrote a trainer checkpoint: transformers saves `rng_state_<rank>.pth` per
    process with several, one `rng_state.pth` with one."""
    return len(list(Path(ckpt).glob("rng_state_*.pth"))) or 1


def process_rank() -> int:
    """This process's global rank (RANK, exported before torch.distributed starts); 0 alone."""
    return int(os.environ.get("RANK", "0") or 0)


def process_count() -> int:
    """The run's world size (WORLD_SIZE); 1 alone."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def last_checkpoint(run_dir: Path | str, problems: list[str] | None = None) -> Path | None:
    """The newest readable checkpoint; newer unreadable ones are described in `problems`."""
    for ckpt in checkpoints(run_dir):
        problem = checkpoint_problem(ckpt)
        if problem is None:
            return ckpt
        if problems is not None:
            problems.append(f"{ckpt.name} is unreadable ({problem})")
    return None
