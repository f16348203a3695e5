"""Figures kept by the records they were drawn from: a stamp in each PNG, a figure redrawn only when it changes.

A figure's stamp is a hash of everything it is drawn from: its data (the rows of the collected frame
it plots, without the runs' config columns it does not draw, or the files of the run it reads: name
and content hash), its options, the
source of the code that draws it and matplotlib's version. It is written into the PNG itself (a
tEXt chunk, `STAMP_KEY`), so a copied figure keeps it and no other file sits beside the figures.
`current(path, stamp)` says whether the file at `path` was drawn from exactly that: then drawing it
again would give the same bytes, and `stare-lab plot` keeps it (docs/performance.md, "Figures").
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

STAMP_KEY = "stare-lab stamp"
_PNG = b"\x89PNG\r\n\x1a\n"


def digest(*parts: Any) -> str:
    """A short hash of JSON-able parts (a stamp)."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@functools.cache
def code_stamp(*files: str) -> str:
    """Hash of the source of `files` (paths, or folders whose *.py count) and matplotlib's version."""
    import matplotlib  # deferred: matplotlib, for the readers that stamp no figure

    h = hashlib.sha256(matplotlib.__version__.encode())
    for name in files:
        path = Path(name)
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:24]


def files_stamp(paths: Iterable[Path]) -> list[tuple[str, str]]:
    """(name, sha256 of the content) of each existing file, in name order: what a figure read.

    Content, not modification time: a figure drawn from the same bytes has the same stamp wherever and
    whenever they were written, so a regenerated figure is byte-identical (kept batches are ~200 KB a
    run: hashing them costs milliseconds)."""
    out = []
    for p in sorted(map(Path, paths)):
        try:
            data = p.read_bytes()
        except OSError:
            continue
        out.append((p.name, hashlib.sha256(data).hexdigest()))
    return out


def config_stamp(path: Path) -> str | None:
    """Hash of a run's config.yaml without `run.root` (the absolute path of the runs folder: where the
    run lies, not what it did), so the same run made in another checkout draws the same bytes; None if
    the file is missing."""
    try:
        cfg = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_YAML_LOADER)
    except OSError:
        return None
    if isinstance(cfg, dict) and isinstance(cfg.get("run"), dict):
        cfg["run"].pop("root", None)
    return digest(cfg)


def frame_stamp(df: Any) -> str:
    """Hash of a pandas frame's values, index and column names, without the runs' flattened config
    (`cfg.*` columns: no figure draws them, and `cfg.run.root` is the checkout's absolute path)."""
    import pandas as pd  # deferred: pandas, as matplotlib above

    df = df[[c for c in df.columns if not str(c).startswith("cfg.")]]
    values = pd.util.hash_pandas_object(df, index=True).to_numpy().tobytes() if len(df) else b""
    return hashlib.sha256(values + repr(list(df.columns)).encode()).hexdigest()[:24]


def metadata(stamp: str | None) -> dict[str, str]:
    """The `metadata` of matplotlib's `savefig(..., format="png")` that writes the stamp."""
    return {STAMP_KEY: stamp} if stamp else {}


def read_stamp(path: Path | str) -> str | None:
    """The stamp written in a PNG's text chunks before its image data; None when absent or not a PNG."""
    try:
        with open(path, "rb") as f:
            if f.read(8) != _PNG:
                return None
            while True:
                head = f.read(8)
                if len(head) < 8:
                    return None
                length, kind = struct.unpack(">I4s", head)
                if kind in (b"IDAT", b"IEND"):
                    return None
                data = f.read(length)
                f.seek(4, 1)  # CRC
                if kind == b"tEXt":
                    key, _, value = data.partition(b"\0")
                    if key.decode("latin-1") == STAMP_KEY:
                        return value.decode("latin-1")
    except OSError:
        return None


def current(path: Path | str, stamp: str | None) -> bool:
    """Whether the PNG at `path` exists and was drawn from what `stamp` names."""
    return stamp is not None and read_stamp(path) == stamp
