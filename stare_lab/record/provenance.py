"""What code ran an attempt (status.json's `provenance`): the project's commit or version, the libraries'
versions, Python and the device; `code_version` is the short form that the tables and the viewer show.
For a model that stare_lab converted from a packaged file (stare_lab.models.smollm2), also which weights:
`read_model_source` reads what the conversion wrote into the folder (`MODEL_SOURCE_FILE`), kept as the
attempt's `model`."""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

PROVENANCE_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate")
# In a converted model folder: its source file with that file's sha256, each file's sha256, and one hash
# over them (`folder_sha256`); written by the conversion (stare_lab.models.smollm2), read here.
MODEL_SOURCE_FILE = "stare_lab_source.json"


def provenance(device: str | None = None) -> dict[str, Any]:
    """What code ran an attempt: the project's git commit and dirty flag (tracked files) when the
    package sits in its git checkout, else its installed version; library versions; Python; device."""

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    root = Path(__file__).resolve().parents[2]  # the checkout: stare_lab/record/ is two below
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
    run's rule (`rule_modules`, stare_lab.methods.outside): an edited rule file is other code."""
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


def read_model_source(folder: Path | str) -> dict[str, Any] | None:
    """An attempt's `model`: `{"name", "folder", "source": {"package", "version", "file", "sha256", "license"},
    "folder_sha256"}` of a folder converted from a packaged file; None for any other model (a hub name, a
    folder without `MODEL_SOURCE_FILE`). The caller checked the folder against its hashes first
    (stare_lab.models.resolve_model_path)."""
    path = Path(folder) / MODEL_SOURCE_FILE
    if not path.is_file():
        return None
    source = json.loads(path.read_text())
    return {
        "name": source["name"],
        "folder": str(Path(folder).resolve()),
        "source": source["source"],
        "folder_sha256": source["folder_sha256"],
    }
