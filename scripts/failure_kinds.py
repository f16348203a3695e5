"""What a sweep's final evaluations are made of: per arm, the share of samples that are right, that write the
right number but end on another (an extraction or format failure: the answer is read as the last number),
that give a wrong number (the right one nowhere in the completion), and that give none, from each run's own
evaluation samples (eval/<benchmark>/*.parquet: the completion is the column `answer`).

    python scripts/failure_kinds.py runs/smollm2_chain_sum rg:chain_sum

A gain that is only format shows as "no number" or "right, not last" falling with "wrong number"
unchanged; a gain in the task itself as "wrong number" falling. Printed as a markdown table: mean over the
arm's seeds, each seed's value in brackets; per arm also the mean completion length in tokens.
"""

from __future__ import annotations

import re
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
        written = [
            bool(re.search(rf"(?<![\d.]){re.escape(str(gold))}(?![\d]|\.\d)", str(text)))
            for text, gold in zip(samples["answer"], samples["gold"], strict=True)
        ]
        not_last = ~right & ~none & pd.Series(written, index=samples.index)
        rows.append(
            {
                "arm": label.split(" seed=")[0],
                "seed": int(label.split(" seed=")[1]),
                "right": right.mean(),
                "right, not last": not_last.mean(),
                "wrong number": (~right & ~none & ~not_last).mean(),
                "no number": none.mean(),
                "length": samples["length"].mean(),
            }
        )
    return rows


def main(argv: list[str]) -> None:
    root, benchmark = Path(argv[0]), argv[1]
    df = pd.DataFrame(run_rows(root, benchmark))
    cols = ["right", "right, not last", "wrong number", "no number"]
    print(f"| arm | seeds | {' | '.join(cols)} | length (tokens) |")
    print("|:--|--:|" + "--:|" * (len(cols) + 1))
    for arm, g in df.groupby("arm", sort=False):
        g = g.sort_values("seed")
        cells = [f"{100 * g[c].mean():.1f}% ({', '.join(f'{100 * v:.1f}' for v in g[c])})" for c in cols]
        print(f"| {arm} | {len(g)} | {' | '.join(cells)} | {g['length'].mean():.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
