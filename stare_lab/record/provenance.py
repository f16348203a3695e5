"""What code ran an attempt (status.json's `provenance`): the project's commit or version, the libraries'
versions, Python and the device; `code_version` is the short form that the tables and the viewer show."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

PROVENANCE_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate")


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
