"""A new rule is one module: registering it from a file of its own (tests/support/rule_plugin_example.py) makes
it available to get_method, the invariant suite and the trainer without any other file changing.

The plugin is imported in a fresh pytest process (`-p rule_plugin_example`), so this session's
registry (which other test files enumerate) never sees it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stare_lab.methods import get_method, list_methods

HERE = Path(__file__).resolve().parent
SUPPORT = HERE.parent / "support"  # rule_plugin_example, loaded by `-p` before pytest reads its pythonpath
PLUGIN = "plugin_example"


def test_a_rule_module_of_its_own_is_picked_up_everywhere():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "rule_plugin_example",
        "-p",
        "no:cacheprovider",
        str(HERE / "test_rule_invariants.py"),
        str(HERE / "test_rule_plugin.py"),
        "-k",
        PLUGIN,
    ]
    run = subprocess.run(cmd, cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=900)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    # every invariant of the suite, parametrised over list_methods(), plus the trainer run below
    import rule_invariants

    assert passed == len(rule_invariants.CHECKS) + 2, summary
    assert "skipped" not in summary, summary


def _registered() -> None:
    if PLUGIN not in list_methods():
        pytest.skip("runs inside test_a_rule_module_of_its_own_is_picked_up_everywhere's process")


def test_plugin_example_is_registered_last_and_validated():
    _registered()
    assert list_methods()[-1] == PLUGIN
    rule = get_method(PLUGIN)
    assert rule.needs == {"logp"} and rule.attn_layers is None
    with pytest.raises(ValueError, match="unknown parameter 'rho'"):
        get_method(PLUGIN, rho=0.2)


def test_plugin_example_trains_two_steps(make_trainer):
    """A real 2-step run on the tiny built-in model: weights reach the loss and the parameters move."""
    _registered()
    from stare_lab.tasks.arithmetic import ArithmeticTask

    trainer = make_trainer(get_method(PLUGIN), ArithmeticTask(train_size=32, heldout_size=8).train_dataset())
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters(), strict=True))
    logs = [h for h in trainer.state.log_history if "rule/kept_frac" in h]
    assert len(logs) == 2 and all(0 < h["tokens/selected_frac"] < 1 for h in logs)
    assert all(h["tokens/weight_mean"] > 0 for h in logs)
    with pytest.raises(ValueError, match="eps_high=0.2 but trainer.epsilon_high=0.28"):
        make_trainer(get_method(PLUGIN, eps_high=0.2), trainer.train_dataset)
