"""W&B offline run files read back with W&B's own reader (`wandb leet inspect --json`), for the tests of
what the runs, the token page, the sweep summary and the dashboard log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def wandb_records(folder: Path) -> list[dict]:
    """Every record of one offline run folder, decoded by W&B's own reader."""
    wandb_cli = Path(sys.executable).with_name("wandb")
    out = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def run_records(wandb_dir: Path, run_id: str) -> list[dict]:
    """Every record of every offline folder of one W&B run id (a resumed run writes a new folder)."""
    folders = sorted(f for f in wandb_dir.glob("offline-run-*") if (f / f"run-{run_id}.wandb").is_file())
    assert folders, f"no offline files of run {run_id} under {wandb_dir}"
    return [dict(r, folder=str(f)) for f in folders for r in wandb_records(f)]


def final_summary(records: list[dict]) -> dict:
    summary: dict = {}
    for r in records:
        if r["type"] == "summary":
            summary.update(r["summary"].get("update") or {})
    return summary


def history(records: list[dict]) -> list[dict]:
    """The history rows of `run_records`' records, each with the folder it came from."""
    return [dict(r["history"]["item"], folder=r["folder"]) for r in records if r["type"] == "history"]


def history_by_step(records: list[dict]) -> dict[int, dict]:
    return {r["history"]["item"]["_step"]: r["history"]["item"] for r in records if r["type"] == "history"}


def media(item: dict, key: str) -> dict:
    """A logged media entry ({"_type", "path", ...}); leet prints its fields as dotted keys."""
    if isinstance(item.get(key), dict):
        return item[key]
    return {k[len(key) + 1 :]: v for k, v in item.items() if k.startswith(key + ".")}
