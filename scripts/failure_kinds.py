"""What a sweep's final evaluations are made of: per arm, the share of samples that are right, that give a
wrong number, and that give none, from each run's own evaluation samples (eval/<benchmark>/*.parquet).

    python scripts/failure_kinds.py runs/smollm2_chain_sum rg:chain_sum

A gain that is only format shows as "no answer" falling with "wrong" unchanged; a gain in the task itself
as "wrong" falling. Printed as a markdown table: mean over the arm's seeds, each seed's value in brackets.
Also per arm: the mean completion length in characters, and the share of completions that are a bare
answer (nothing but the number, after stripping whitespace and a final period).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import yaml

from stare_lab.record import read_eval_results


def run_rows(root: Path, benchmark: str) -> list[dict]:
    rows = []
    for run_dir in sorted(p for p in root.iterdir() if (p / "config.yaml").is_file()):
        label = yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["label"]
        finals = [r for r in read_eval_results(run_dir) if r.get("final") and r["benchmark"] == benchmark]
        if not finals:
            print(f"{label}: no final evaluation of {benchmark} (left out)", file=sys.stderr)
            continue
        (path,) = (run_dir / "eval").glob(f"*/{finals[0]['settings_key']}.parquet")
        samples = pd.read_parquet(path)
        none = samples["extracted"].isna()
        right = samples["correct"].astype(bool)
        text = samples["text"].astype(str).str.strip().str.rstrip(".")
        rows.append(
            {
                "arm": label.split(" seed=")[0],
                "seed": int(label.split(" seed=")[1]),
                "right": right.mean(),
                "wrong number": (~right & ~none).mean(),
                "no number": none.mean(),
                "length": samples["text"].astype(str).str.len().mean(),
                "bare answer": (text == samples["extracted"].astype(str)).mean(),
            }
        )
    return rows


def main(argv: list[str]) -> None:
    root, benchmark = Path(argv[0]), argv[1]
    df = pd.DataFrame(run_rows(root, benchmark))
    cols = ["right", "wrong number", "no number", "bare answer"]
    print(f"| arm | seeds | {' | '.join(cols)} | length (chars) |")
    print("|:--|--:|" + "--:|" * (len(cols) + 1))
    for arm, g in df.groupby("arm", sort=False):
        g = g.sort_values("seed")
        cells = [f"{100 * g[c].mean():.1f}% ({', '.join(f'{100 * v:.1f}' for v in g[c])})" for c in cols]
        print(f"| {arm} | {len(g)} | {' | '.join(cells)} | {g['length'].mean():.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
