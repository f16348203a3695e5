"""An arm that trained exactly as the baseline is shown as such, not as a tie (issue 47, item 5).

On a strictly on-policy layout the ratio is 1 and PPO's clip never acts, so rules acting only through it
train as `full` to the bit; the table says "identical to full in training" where every seed's gradient
norm, reward and entropy equal the baseline's run of that seed at every step (not the loss's value: dppo's
differs from full's with the same gradient)."""

from __future__ import annotations

import json

import fixtures_runs as fx
import pandas as pd

from stare_lab.analysis import collect_problems, collect_runs, collect_training, results_table
from stare_lab.analysis.tables import identical_in_training
from stare_lab.record.frames import TRAIN_COLUMNS


def _training(rows: list[tuple[str, int, int, str, float]]) -> pd.DataFrame:
    """collect_training's frame from (arm, seed, step, metric, value) rows."""
    frame = pd.DataFrame(rows, columns=["arm", "seed", "step", "metric", "value"])
    for column in TRAIN_COLUMNS:
        if column not in frame:
            frame[column] = frame["arm"] if column in ("rule", "label") else "x"
    return frame[TRAIN_COLUMNS]


def _steps(arm: str, seed: int, rewards: list[float], norms: list[float]) -> list[tuple[str, int, int, str, float]]:
    return [(arm, seed, i + 1, "reward", v) for i, v in enumerate(rewards)] + [
        (arm, seed, i + 1, "grad_norm", v) for i, v in enumerate(norms)
    ]


def test_identical_in_training_by_hand():
    full = _steps("full", 0, [0.5, 0.25], [1.0, 2.0]) + _steps("full", 1, [0.125, 0.5], [3.0, 4.0])
    same = _steps("stapo", 0, [0.5, 0.25], [1.0, 2.0]) + _steps("stapo", 1, [0.125, 0.5], [3.0, 4.0])
    one_bit = _steps("dppo", 0, [0.5, 0.25], [1.0, 2.0]) + _steps("dppo", 1, [0.125, 0.5000000000000001], [3.0, 4.0])
    other_seed = _steps("archer", 0, [0.5, 0.25], [1.0, 2.0]) + _steps("archer", 7, [0.5, 0.25], [1.0, 2.0])
    fewer_steps = _steps("ce_gppo", 0, [0.5], [1.0]) + _steps("ce_gppo", 1, [0.125], [3.0])
    noisy = [(a, s, st, "loss", 0.1 * st) for a, s, st, _, _ in same]  # the loss's value is not compared
    frame = _training(full + same + one_bit + other_seed + fewer_steps + noisy)
    assert identical_in_training(frame, "full") == {"stapo"}
    assert identical_in_training(frame, None) == frozenset()
    assert identical_in_training(_training(same), "full") == frozenset()  # no baseline runs
    assert identical_in_training(_training(full + same), "stapo") == {"full"}  # the baseline is any arm


def test_the_table_says_identical_where_an_arm_trained_as_full(tmp_path):
    sweep = fx.write_sweep(tmp_path)
    for seed in (1, 2, 3):  # full and stare log the same reward, entropy and gradient norm; rsi_band others
        for method, variant, shift in (("full", None, 0.0), ("stare", None, 0.0), ("rsi_band", "[0.5,1]", 0.01)):
            if (method, variant, seed) not in fx.AVG:
                continue
            path = sweep / fx.run_id(method, variant, seed) / "metrics.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            for row in rows:
                row.update(reward=0.1 * row["step"] + seed + shift, entropy=0.5, grad_norm=1.0 / row["step"] + shift)
                row["loss"] = 0.01 * row["step"] if method == "stare" else -0.02  # another value, the same gradient
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = results_table(collect_runs(sweep), per_problem=collect_problems(sweep), training=collect_training(sweep))
    assert table.identical == {"stare"}
    text = table.to_markdown()
    same = "(identical to full in training)"
    assert f"| stare | 3 | 20.0 ± 5.0 {same} | 56.0 ± 1.0 {same} | 38.0 {same} |" in text
    assert "| rsi_band[0.5,1] | 2 | 30.0 ± 7.1 (+10.0 [-58.2, +78.2]) |" in text  # a measured difference as before
    assert (
        "identical to full in training: stare (every seed's gradient norm, reward and entropy equal full's run" in text
    )
    csv = pd.read_csv(pd.io.common.StringIO(table.to_csv()))
    assert dict(zip(csv["rule"], csv["identical_in_training"], strict=False)) == {
        "full": False,
        "stare": True,
        "rsi_band[0.5,1]": False,
    }
    assert r"(identical to full in training)" in table.to_latex()
    untouched = results_table(collect_runs(sweep), per_problem=collect_problems(sweep))  # no training given
    assert untouched.identical == frozenset() and "identical to" not in untouched.to_markdown()
