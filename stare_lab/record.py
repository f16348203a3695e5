"""The run record (docs/run_record.md): its file names and every reader and writer of it.

Runner, worker, evaluation, tracking, analysis, sweep status and search all go through this
module, so a file name or format lives in one place. It imports no torch, transformers or trl:
`sweep status` and the analysis read records in milliseconds.

Writes are atomic (temp file + rename) except metrics.jsonl, which is appended one fsync'ed row
per step; its readers tolerate a torn last row. A record that can not be parsed is never taken
for a missing one: `read_status` answers a `corrupt` state naming the problem, and the metrics
scan returns the unreadable lines beside the good rows.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import time
import zipfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stare_lab.utils import atomic_write, atomic_write_json, atomic_write_text

CONFIG_FILE = "config.yaml"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
FINAL_DIR = "final"
EVAL_DIR = "eval"
WANDB_DIR = "wandb"
CLAIM_FILE = ".claim"  # flock'ed by the one worker executing the run
RULE_STATE_FILE = "rule_state.json"  # written by the trainer into each checkpoint
STATES = ("pending", "running", "finished", "failed", "interrupted")
CORRUPT = "corrupt"  # read_status's state for a status.json it can not parse
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_STEP_DIR = re.compile(r"step-(\d+)")


class RecordError(Exception):
    """A run record that can not be used as it is (one line naming the file and the problem)."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def first_line(text: str | None) -> str | None:
    if not text or not text.strip():
        return None if text is None else text
    return text.strip().splitlines()[0]


def elapsed(since: float) -> float:
    return round(time.time() - since, 3)


# ------------------------------------------------------------------------------------ status
def new_status(label: str | None = None, variant: str | None = None, seed: int | None = None) -> dict[str, Any]:
    return {
        "state": "pending",
        "attempts": 0,
        "host": None,
        "slurm_job_id": None,
        "created": now_iso(),
        "started": None,
        "finished": None,
        "duration_s": 0.0,
        "error": None,
        "traceback": None,
        "label": label,
        "variant": variant,
        "seed": seed,
        "pid": None,
        "pid_start": None,
        "restarts": 0,
    }


def read_status(run_dir: Path | str) -> dict[str, Any] | None:
    """status.json, None when there is none, or `{"state": "corrupt", "error": ...}` when it can
    not be parsed (a run with a garbled record must not look like one never started)."""
    path = Path(run_dir) / STATUS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        return {"state": CORRUPT, "error": f"{path}: unreadable ({e})"}
    try:
        status = json.loads(text)
    except ValueError as e:
        return {"state": CORRUPT, "error": f"{path}: not JSON ({e})"}
    if not isinstance(status, dict) or status.get("state") not in STATES:
        return {"state": CORRUPT, "error": f"{path}: no valid state in {text[:60]!r}"}
    return status


def write_status(run_dir: Path | str, status: dict[str, Any]) -> dict[str, Any]:
    """Atomically; on a full disk (no room for the temp file), a compact record without the
    traceback is written over the old file in place, which needs no new blocks."""
    path = Path(run_dir) / STATUS_FILE
    try:
        atomic_write_json(path, status)
    except OSError as e:
        if e.errno != errno.ENOSPC or not path.is_file():
            raise
        compact = json.dumps({**status, "traceback": None}, separators=(",", ":")).encode()
        if len(compact) > path.stat().st_size:
            raise
        with open(path, "r+b") as f:
            f.write(compact)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
    return status


def update_status(run_dir: Path | str, **changes: Any) -> dict[str, Any]:
    status = read_status(run_dir)
    if status is not None and status.get("state") == CORRUPT:
        set_aside(Path(run_dir) / STATUS_FILE)  # kept beside the new record, never overwritten
        status = None
    status = status or new_status()
    status.update(changes)
    return write_status(run_dir, status)


def bad_copy_path(path: Path) -> Path:
    """Where a damaged record file is kept: `<name>.bad-<time>` beside it."""
    return path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%S')}")


def set_aside(path: Path) -> Path:
    """Rename a damaged record file out of the way, keeping it (`bad_copy_path`)."""
    dest = bad_copy_path(path)
    os.replace(path, dest)
    return dest


# ------------------------------------------------------------------------------------ claim
class RunClaim:
    """The one worker executing a run holds an exclusive flock on `<run_dir>/.claim`.

    The kernel drops it when the holder dies (SIGKILL included), and on a filesystem whose locks
    reach every host (local disk, NFSv4, Lustre mounted with `flock`) other hosts see it too.
    Whoever holds it may train; anyone else only watches.
    """

    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / CLAIM_FILE
        self._fd: int | None = None

    def acquire(self, wait_s: float = 2.0) -> bool:
        """Take the claim; False if another process holds it. The short wait covers `claim_held`,
        which takes a shared lock for a moment to look."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.time() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return True
            except BlockingIOError:
                if time.time() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def claim_held(run_dir: Path | str) -> bool:
    """Whether a live process holds the run's claim (probed without waiting)."""
    return flock_held(Path(run_dir) / CLAIM_FILE)


def flock_held(path: Path) -> bool:
    """Whether a live process holds an flock on `path` (probed with a shared lock, without waiting)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def run_label(run_dir: Path | str) -> str:
    """The run's readable label (config.yaml's run.label, e.g. `stare seed=0`), else its id or folder name."""
    import yaml

    run_dir = Path(run_dir)
    try:
        run = (yaml.safe_load((run_dir / CONFIG_FILE).read_text()) or {}).get("run") or {}
        return str(run.get("label") or run.get("id") or run_dir.name)
    except (OSError, yaml.YAMLError, AttributeError):
        return run_dir.name


# ----------------------------------------------------------------------------------- metrics
def metrics_path(run_dir_or_file: Path | str) -> Path:
    p = Path(run_dir_or_file)
    return p / METRICS_FILE if p.is_dir() else p


def scan_metrics(run_dir_or_file: Path | str) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """(rows, bad lines as (line number, text)) of metrics.jsonl; a missing file has neither."""
    try:
        lines = metrics_path(run_dir_or_file).read_text(errors="replace").splitlines()
    except OSError:
        return [], []
    rows, bad = [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad.append((n, line))
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), (int, float)) and not isinstance(row["step"], bool):
            rows.append(row)
        else:
            bad.append((n, line))
    return rows, bad


def read_metrics(run_dir_or_file: Path | str) -> list[dict[str, Any]]:
    """The parseable rows of metrics.jsonl (see `scan_metrics` for the others)."""
    return scan_metrics(run_dir_or_file)[0]


def write_metrics(run_dir: Path | str, rows: list[dict[str, Any]]) -> None:
    """Replace metrics.jsonl with `rows` (in step order), atomically."""
    text = "".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["step"]))
    atomic_write_text(metrics_path(run_dir), text)


def append_metrics(run_dir: Path | str, row: dict[str, Any]) -> None:
    with open(Path(run_dir) / METRICS_FILE, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_metrics(run_dir_or_file: Path | str, last_step: int) -> tuple[int, Path | None]:
    """Keep rows with step ≤ last_step (the checkpoint being resumed) so no step is logged twice.

    Returns (rows dropped, where the old file was kept when it held unreadable lines other than a
    torn last one: damage is set aside, not silently erased).
    """
    path = metrics_path(run_dir_or_file)
    if not path.is_file():
        return 0, None
    rows, bad = scan_metrics(path)
    n_lines = len(path.read_text(errors="replace").splitlines())
    kept_copy = None
    if any(n != n_lines for n, _ in bad):
        kept_copy = bad_copy_path(path)
        atomic_write(kept_copy, lambda tmp: Path(tmp).write_bytes(path.read_bytes()))
    keep = [r for r in rows if r["step"] <= last_step]
    # rewritten even when nothing is dropped: a torn last line must go too
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))
    return len(rows) - len(keep), kept_copy


# ------------------------------------------------------------------------------- checkpoints
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


# -------------------------------------------------------------------------------- evaluation
# What an evaluation result depends on besides the model: results differing in any of these (or in
# the checkpoint step) are different results and live side by side.
EVAL_SETTINGS = ("n", "temperature", "top_p", "max_tokens", "verifier", "engine")
RESULT_SETTINGS = EVAL_SETTINGS + ("num_problems",)  # what a stored result states besides its metrics
# A setting a result written before it existed did not state, and the value it had then.
SETTING_DEFAULTS = {"engine": "transformers"}


def result_setting(result: dict[str, Any], key: str) -> Any:
    """A stored result's evaluation setting; one written before the setting existed has its old value."""
    return result.get(key, SETTING_DEFAULTS.get(key))


def _num(x: Any) -> str:
    return f"{float(x):g}"


def settings_key(settings: dict[str, Any], step: int | None) -> str:
    """The file stem of one evaluation: `step-2_n4_t1_p0.7_m8_exact` (step `final` when unknown)."""
    return (
        f"step-{'final' if step is None else step}_n{int(settings['n'])}_t{_num(settings['temperature'])}"
        f"_p{_num(settings['top_p'])}_m{int(settings['max_tokens'])}_{settings['verifier']}"
        + ("" if result_setting(settings, "engine") == "transformers" else f"_{settings['engine']}")
    )


# The per-sample parquet of an evaluation: one row per sampled answer (column, pyarrow type).
SAMPLE_COLUMNS = (
    ("problem_id", "string"),
    ("sample_index", "int64"),
    ("answer", "string"),
    ("extracted", "string"),  # the answer the verifier extracted (None: nothing to extract)
    ("gold", "string"),
    ("correct", "bool_"),
    ("length", "int64"),  # completion tokens
)


def eval_result_path(run_dir: Path | str, benchmark: str, settings: dict[str, Any], step: int | None) -> Path:
    """`eval/<benchmark>/<settings key>.json`; the per-sample parquet sits beside it."""
    return Path(run_dir) / EVAL_DIR / benchmark / f"{settings_key(settings, step)}.json"


def write_eval_result(run_dir: Path | str, result: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    """`eval/<benchmark>/<key>.parquet` (one row per sample) and `.json` (settings inside), atomically.
    A result under the same settings and step is replaced; any other is kept."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = eval_result_path(run_dir, result["benchmark"], result, result["step"])
    result = {**result, "settings_key": path.stem}
    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in SAMPLE_COLUMNS])
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=schema)
    atomic_write(path.with_suffix(".parquet"), lambda tmp: pq.write_table(table, tmp))
    text = json.dumps(result, indent=2, allow_nan=False) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


def eval_files(run_dir: Path | str) -> Iterator[tuple[Path, bool | None, int | None]]:
    """(json path, final?, step from the folder name) of every evaluation result, both layouts:
    eval/<benchmark>/<key>.json (final? read from the file: None here), and the older
    eval/<benchmark>.json (final) and eval/step-<N>/<benchmark>.json (intermediate)."""
    root = Path(run_dir) / EVAL_DIR
    for p in sorted(root.glob("[!.]*.json")):  # not the .x.json.tmp of a write in progress
        yield p, True, None
    for sub in sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []:
        m = _STEP_DIR.fullmatch(sub.name)
        for p in sorted(sub.glob("[!.]*.json")):
            yield (p, False, int(m.group(1))) if m else (p, None, None)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a record file, or None when missing or unparsable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_eval_results(run_dir: Path | str) -> list[dict[str, Any]]:
    """Every evaluation result of a run, each with `path`, `benchmark`, `final` and `step` filled in."""
    out = []
    for path, final, dir_step in eval_files(run_dir):
        data = read_json(path)
        if data is None:
            continue
        data.setdefault("benchmark", path.parent.name if final is None else path.stem)
        data["step"] = data.get("step", dir_step)
        data["final"] = bool(data.get("final", True)) if final is None else final
        out.append({**data, "path": str(path)})
    return out


def same_settings(result: dict[str, Any], settings: dict[str, Any]) -> bool:
    return all(_same(result_setting(result, k), settings.get(k)) for k in EVAL_SETTINGS)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def find_eval_result(
    run_dir: Path | str, benchmark: str, settings: dict[str, Any], step: int | None, final: bool
) -> dict[str, Any] | None:
    """The result of this benchmark under exactly these settings at this step, in either layout."""
    for r in read_eval_results(run_dir):
        if r["benchmark"] == benchmark and r["final"] == final and r.get("step") == step and same_settings(r, settings):
            return r
    return None


def eval_metric(run_dir: Path | str, benchmark: str, metric: str, step: int | None = None) -> float | None:
    """A metric of the final evaluation (or the one at `step`) of a benchmark; among several
    settings, the newest result that reports the metric."""
    found = [
        r
        for r in read_eval_results(run_dir)
        if r["benchmark"] == benchmark
        and (r["final"] if step is None else (not r["final"] and r.get("step") == step))
        and (r.get("metrics") or {}).get(metric) is not None
    ]
    if not found:
        return None
    newest = max(found, key=lambda r: Path(r["path"]).stat().st_mtime)
    return float(newest["metrics"][metric])


# -------------------------------------------------------------------------------- provenance
PROVENANCE_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate")


def provenance(device: str | None = None) -> dict[str, Any]:
    """What code ran an attempt: the project's git commit and dirty flag (tracked files) when the
    package sits in its git checkout, else its installed version; library versions; Python; device."""
    import platform
    import subprocess
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    root = Path(__file__).resolve().parents[1]
    commit = dirty = None
    if (root / ".git").exists() and (root / "pyproject.toml").is_file():
        try:
            git = ["git", "-C", str(root)]
            commit = (
                subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20).stdout.strip()
                or None
            )
            dirty = (
                bool(
                    subprocess.run(
                        [*git, "status", "--porcelain", "--untracked-files=no"],
                        capture_output=True,
                        text=True,
                        timeout=20,
                    ).stdout.strip()
                )
                if commit
                else None
            )
        except (OSError, subprocess.TimeoutExpired):
            commit = dirty = None
    return {
        "stare_lab": version("stare_lab"),
        "commit": commit,
        "dirty": dirty,
        "python": platform.python_version(),
        "versions": {name: version(name) for name in PROVENANCE_PACKAGES},
        "device": device,
    }


def code_version(status_or_provenance: dict[str, Any] | None) -> str | None:
    """`<commit[:10]>[+dirty]` or `stare_lab <version>` of a provenance, or of a status's last attempt,
    followed by ` <module>@<sha256[:10]>` for the module kept outside the package that defines the
    run's rule (`rule_modules`, stare_lab.rule_imports): an edited rule file is other code."""
    p = status_or_provenance or {}
    if "provenance" in p:
        p = (p["provenance"] or [{}])[-1] if isinstance(p["provenance"], list) else p["provenance"]
    if p.get("commit"):
        own = p["commit"][:10] + ("+dirty" if p.get("dirty") else "")
    else:
        own = f"stare_lab {p['stare_lab']}" if p.get("stare_lab") else None
    rules = [m for m in p.get("rule_modules") or [] if m.get("defines_rule")]
    outside = [f"{m.get('module')}@{(m.get('sha256') or 'unhashed')[:10]}" for m in rules]
    return " ".join([own or "unrecorded", *outside]) if outside else own
