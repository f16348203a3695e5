"""The README's "A rule kept outside the package", run as written in a temporary folder outside the
repository: its module, its sweep, its commands (a dry run and a real 2-step `train --import`), its
entry point (a *.dist-info built from the pyproject snippet), and its rule on a case worked by hand."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
STARE_LAB = str(Path(sys.executable).parent / "stare-lab")


def section_blocks() -> dict[str, str]:
    """{language: the fenced block's text} of the section (one block per language)."""
    text = README.read_text()
    start = text.index("### A rule kept outside the package")
    section = text[start : text.index("\n## ", start)]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    languages = [lang for lang, _ in blocks]
    assert sorted(languages) == ["bash", "python", "toml", "yaml"], languages
    return dict(blocks)


def run(cmd: list[str], cwd: Path, *pythonpath: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHONPATH": os.pathsep.join(map(str, pythonpath)), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_readme_example_runs_from_a_folder_of_its_own(tmp_path):
    blocks = section_blocks()
    module, sweep = blocks["python"], blocks["yaml"]
    assert module.startswith("# my_rules.py") and sweep.startswith("# my_sweep.yaml")
    (tmp_path / "my_rules.py").write_text(module)
    (tmp_path / "my_sweep.yaml").write_text(sweep)

    commands = [line for line in blocks["bash"].splitlines() if line.strip()]
    assert [c.split()[:3] for c in commands] == [["stare-lab", "sweep", "run"], ["stare-lab", "train", "--import"]]
    dry, train = (run([STARE_LAB, *shlex.split(c)[1:]], tmp_path) for c in commands)
    assert dry.returncode == 0, dry.stderr
    planned = re.findall(r"│ \d │ \w{12} │ (\w+ seed=\d) ", dry.stdout)
    assert planned == [f"{m} seed={s}" for m in ("full", "above_median_entropy") for s in range(3)], dry.stdout
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-3000:]
    (run_dir,) = [p.parent for p in (tmp_path / "runs" / "train").glob("*/status.json")]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished"
    assert [(m["module"], m["file"]) for m in status["provenance"][-1]["rule_modules"]] == [
        ("my_rules", str(tmp_path / "my_rules.py"))
    ]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(0 < r["tokens/selected_frac"] <= 0.5 for r in rows)


def test_the_readme_entry_point_registers_the_rule_once_installed(tmp_path):
    """A *.dist-info on sys.path is what `pip install` leaves: importlib.metadata reads it as is."""
    blocks = section_blocks()
    site, work = tmp_path / "site", tmp_path / "work"
    site.mkdir()
    work.mkdir()
    (site / "my_rules.py").write_text(blocks["python"])
    # the table [project.entry-points."stare_lab.rules"] of name = "module" lines (tomllib is Python ≥ 3.11)
    header, *lines = [line for line in blocks["toml"].splitlines() if line and not line.startswith("#")]
    assert header == '[project.entry-points."stare_lab.rules"]', header
    entry = dict(re.fullmatch(r'(\w+) = "([\w.]+)"', line).groups() for line in lines)
    assert entry == {"my_rules": "my_rules"}
    info = site / "my_rules-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-rules\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[stare_lab.rules]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items()))
    # the sweep without its imports: line: the installed package's rule is there unnamed
    sweep = "\n".join(line for line in blocks["yaml"].splitlines() if not line.startswith("imports:"))
    (work / "my_sweep.yaml").write_text(sweep)
    assert run([STARE_LAB, "sweep", "run", "my_sweep.yaml", "--dry-run"], work, site).returncode == 0
    refused = run([STARE_LAB, "sweep", "run", "my_sweep.yaml", "--dry-run"], work)
    assert refused.returncode == 2 and "unknown method option 'above_median_entropy'" in refused.stderr


HAND = """
import torch
import my_rules
from stare_lab.methods import RuleState, get_method
from stare_lab.stats import TokenStats

# valid entropies 0.1, 0.4, 0.2, 0.9 (the padded 5.0 does not count): median 0.2 (the lower middle);
# kept: 0.4 and 0.9
stats = TokenStats(
    logp=torch.zeros(1, 5), mask=torch.tensor([[1.0, 1, 1, 1, 0]]), advantages=torch.ones(1),
    group=torch.zeros(1, dtype=torch.long), entropy=torch.tensor([[0.1, 0.4, 0.2, 0.9, 5.0]]),
)
out = get_method("above_median_entropy")(stats, RuleState())
print(out.weights.tolist(), out.normalize)
"""


def test_the_readme_rule_on_a_case_worked_by_hand(tmp_path):
    (tmp_path / "my_rules.py").write_text(section_blocks()["python"])
    proc = run([sys.executable, "-c", HAND], tmp_path, tmp_path)
    assert proc.stdout.strip() == "[[0.0, 1.0, 0.0, 1.0, 0.0]] selected", proc.stdout + proc.stderr
