"""The built-in testbed learns: `full` at the demo's settings (its own sweep file, 2 seeds) raises held-out
avg@32 by at least 15 points over the untrained model, and the random-reward control gains less than half
of that (docs/demo.md, "The testbed"). Slow: 6 real runs (~2 min on 2 idle cores); CI runs it (make test-all)."""

from __future__ import annotations

import pytest
import yaml

from stare_lab.analysis import collect_runs
from stare_lab.cli import main
from stare_lab.config.run_config import sweep_path

pytestmark = pytest.mark.slow


def test_full_learns_and_random_reward_does_not(tmp_path):
    demo = yaml.safe_load(sweep_path("demo").read_text())
    demo.update(name="testbed", grid={"method": ["full"]}, output=str(tmp_path / "runs"))
    demo["base"]["logger"] = "none"
    demo["base"]["overrides"].pop("trainer.keep_batches_every", None)
    assert demo["controls"] == ["base", "random_reward"] and demo["seeds"] == [0, 1]
    path = tmp_path / "testbed.yaml"
    path.write_text(yaml.safe_dump(demo))
    assert main(["sweep", "run", str(path)]) == 0
    runs = collect_runs(tmp_path / "runs" / "testbed")
    final = runs[runs["final"].astype(bool) & (runs["metric"] == "avg@32")]
    mean = final.groupby("arm")["value"].mean() * 100
    assert final.groupby("arm")["run"].nunique().to_dict() == {"base": 2, "full": 2, "random_reward": 2}
    gain, random_gain = mean["full"] - mean["base"], mean["random_reward"] - mean["base"]
    assert 15 <= mean["base"] <= 50, mean.to_dict()
    assert gain >= 15, mean.to_dict()
    assert random_gain < gain / 2, mean.to_dict()
