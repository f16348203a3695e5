"""Headless Chromium (the Debian package `chromium`) for the page: its DOM after the script ran, and a screenshot.

Used by the tests, the benchmark and the demo's screenshot; `stare-lab view` itself needs no browser.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-extensions",
    "--hide-scrollbars",
)


def chromium_path() -> str | None:
    """The Chromium on PATH, or None when there is none (`apt-get install -y chromium`). Only PATH: Debian's
    /usr/bin/chromium is a wrapper script that itself needs the basic tools on PATH (grep), so a Chromium
    outside PATH is one that would not start."""
    return shutil.which("chromium")


def _run(page: Path, *extra: str, timeout: float) -> subprocess.CompletedProcess:
    exe = chromium_path()
    if exe is None:
        raise FileNotFoundError("headless Chromium is not installed (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="stare_lab_chromium_") as profile:
        return subprocess.run(
            [exe, *FLAGS, f"--user-data-dir={profile}", *extra, Path(page).resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def dump_dom(page: Path | str, *, budget_ms: int = 5000, timeout: float = 120) -> str:
    """The serialised DOM of `page` after its scripts ran (`--dump-dom`). budget_ms=0: no virtual time
    (the page's clock is then real time, for timing it)."""
    extra = (f"--virtual-time-budget={budget_ms}",) if budget_ms else ()
    done = _run(Path(page), *extra, "--dump-dom", timeout=timeout)
    if done.returncode != 0 or not done.stdout:
        raise RuntimeError(f"chromium --dump-dom failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout


def screenshot(
    page: Path | str,
    out: Path | str,
    *,
    size: tuple[int, int] = (1400, 1000),
    budget_ms: int = 5000,
    timeout: float = 120,
) -> Path:
    """A PNG of the page's first screen."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _run(
        Path(page),
        f"--virtual-time-budget={budget_ms}",
        f"--screenshot={out}",
        f"--window-size={size[0]},{size[1]}",
        timeout=timeout,
    )
    if not out.is_file():
        raise RuntimeError(f"chromium --screenshot wrote nothing ({done.returncode}): {done.stderr.strip()[-500:]}")
    return out
