"""docs/claims.md's worked example, run as written in a temporary folder outside the repository: a rule
kept outside the package, a sweep with two claims about it, its dry run, a real 2-step sweep of the
built-in model and `stare-lab claims` on its records (with the rule's module gone, as a reading command
must work), and a bad claim in the same file refused by the dry run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd

DOC = Path(__file__).resolve().parents[2] / "docs" / "claims.md"
STARE_LAB = str(Path(sys.executable).parent / "stare-lab")


def example_blocks() -> dict[str, str]:
    text = DOC.read_text()
    start = text.index("## A worked example")
    blocks = re.findall(r"```(\w+)\n(.*?)```", text[start:], re.S)
    assert sorted(lang for lang, _ in blocks) == ["bash", "python", "yaml"], blocks
    return dict(blocks)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_the_worked_example_runs_from_a_folder_of_its_own(tmp_path):
    blocks = example_blocks()
    assert blocks["python"].startswith("# my_rules.py") and blocks["yaml"].startswith("# my_claims.yaml")
    (tmp_path / "my_rules.py").write_text(blocks["python"])
    (tmp_path / "my_claims.yaml").write_text(blocks["yaml"])
    commands = [shlex.split(line) for line in blocks["bash"].splitlines() if line.strip()]
    assert [c[:3] for c in commands] == [["stare-lab", "sweep", "run"]] * 2 + [
        ["stare-lab", "claims", "my_claims.yaml"]
    ]
    dry, sweep = (run([STARE_LAB, *c[1:]], tmp_path) for c in commands[:2])
    assert dry.returncode == 0, dry.stderr
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-3000:]
    (tmp_path / "my_rules.py").unlink()  # a reading command imports no rule
    report = run([STARE_LAB, *commands[2][1:]], tmp_path)
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith("Claims of sweep my_claims: 2 claims from 6 finished runs")
    for claim_id in ("above_median_not_worse", "above_median_keeps_entropy"):
        assert re.search(rf"^\| {claim_id} \| own \|", report.stdout, re.M), report.stdout
    csv = pd.read_csv(tmp_path / "claims" / "claims.csv")
    assert list(csv["id"]) == ["above_median_not_worse", "above_median_keeps_entropy"]
    assert set(csv["verdict"]) <= {"supported", "contradicted", "undecided"}
    assert list(csv["seeds"]) == ["above_median_entropy 3, full 3"] * 2
    assert (tmp_path / "claims" / "claims.png").is_file()

    bad = blocks["yaml"].replace("margin: 5 points", "margin: 5")
    (tmp_path / "my_rules.py").write_text(blocks["python"])
    (tmp_path / "bad.yaml").write_text(bad.replace("name: my_claims", "name: bad"))
    refused = run([STARE_LAB, "sweep", "run", "bad.yaml", "--dry-run"], tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith(
        "claims[0].margin: 5: a margin carries its unit, e.g. '5 points' (the unit of avg@4)"
    )
