"""A project outside the repository with rules of its own, one for each way stare_lab imports them
(stare_lab.methods.outside), for tests/methods/test_outside_rule*.py.

    <root>/work/                       the current folder of every command
        cli_rules.py                   `below_median_entropy`, imported by `--import cli_rules`
        sweeps/above_median.py         `above_median_entropy`, imported by the sweep's `imports:`
        sweeps/<name>.yaml             sweeps written by `write_sweep`
    <root>/site/                       on PYTHONPATH only where a test says so (an installed package)
        ep_rules.py                    `high_surprisal`, registered by its entry point
        ep_rules-0.1.dist-info/        METADATA + entry_points.txt: [stare_lab.rules] high_surprisal = ep_rules
    <root>/broken_site/                a package whose entry point names a module that does not exist

Every command runs in a subprocess through the installed `stare-lab` script, whose sys.path holds
neither the repository nor the current folder: the test session's registry never sees these rules
(other test files enumerate it), and nothing is found by accident.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import yaml
from sweep_fixtures import TINY

STARE_LAB = str(Path(sys.executable).parent / "stare-lab")

RULE = '''"""{doc}"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stare_lab.methods import RuleOutput, RuleState, register
from stare_lab.stats import TokenStats


@dataclass(frozen=True)
class Params:
    normalize: str = "selected"


@register("{name}", Params, needs={{"{stat}"}})
def {name}(stats: TokenStats, state: RuleState, p: Params) -> RuleOutput:
    valid = stats.valid
    x = stats.{stat} if "{stat}" == "entropy" else -stats.logp
    median = x[valid].median() if valid.any() else torch.tensor(0.0)
    keep = valid & (x {op} median)
    return RuleOutput(weights=keep.float(), normalize=p.normalize, selected=keep)
'''

# rule name → (module, what it keeps)
RULES = {
    "above_median_entropy": ("above_median", "entropy", ">"),
    "below_median_entropy": ("cli_rules", "entropy", "<"),
    "high_surprisal": ("ep_rules", "logp", ">"),
}


def rule_source(name: str) -> str:
    module, stat, op = RULES[name]
    what = "entropy" if stat == "entropy" else "surprisal"
    doc = f"{name}: keep the tokens whose {what} is {'above' if op == '>' else 'below'} the batch median."
    return RULE.format(doc=doc, name=name, stat=stat, op=op)


def make_project(root: Path) -> Path:
    """The layout of the module docstring under `root`; returns `root`."""
    work, site, broken = root / "work", root / "site", root / "broken_site"
    for d in (work / "sweeps", site, broken):
        d.mkdir(parents=True, exist_ok=True)
    (work / "sweeps" / "above_median.py").write_text(rule_source("above_median_entropy"))
    (work / "cli_rules.py").write_text(rule_source("below_median_entropy"))
    (site / "ep_rules.py").write_text(rule_source("high_surprisal"))
    _dist(site, "ep_rules", "0.1", "high_surprisal = ep_rules")
    _dist(broken, "broken_rules", "0.2", "gone = broken_rules_missing")
    return root


def _dist(folder: Path, name: str, version: str, entry: str) -> None:
    """An installed distribution as pip leaves it: a *.dist-info folder that importlib.metadata reads."""
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[stare_lab.rules]\n{entry}\n")


def write_sweep(root: Path, name: str, methods: list[str], imports: list[str] | None = None, **fields) -> Path:
    """work/sweeps/<name>.yaml: the tiny real-runner settings, eval n=2, local launcher, output work/runs."""
    data: dict = {"name": name}
    if imports is not None:
        data["imports"] = imports
    data |= {
        "base": {"model": "builtin", "logger": "none", "overrides": dict(TINY)},
        "grid": {"method": methods},
        "seeds": [0],
        "eval": {"n": 2},
        "launcher": {"name": "local", "workers": 1},
        "output": "runs",
    }
    data.update(fields)
    path = root / "work" / "sweeps" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def env(*pythonpath: Path, **extra: str) -> dict[str, str]:
    """The command's environment: PYTHONPATH only the given folders (never the repository)."""
    out = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out |= {"WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    return out | extra


def stare_lab(root: Path, *args: str, pythonpath: tuple[Path, ...] = (), timeout: float = 600, **extra: str):
    """`stare-lab ARGS` in <root>/work; the CompletedProcess."""
    return subprocess.run(
        [STARE_LAB, *args],
        cwd=root / "work",
        env=env(*pythonpath, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
