"""Every rule, and both controls, on a real LM: `model=smollm2` (SmolLM2-135M-Instruct converted from its
pip wheel, docs/models.md) through the real trainer. Each registered rule and the random-reward control
train two optimizer steps and change the model's parameters; `base` evaluates the untrained model.

The layout is small (2 prompts × 4 rollouts of at most 8 tokens per step) so that the 22 runs take
minutes on 2 cores. The rules train under the random-reward control's rewards (Bernoulli(0.5), seeded by
the run's seed and step: the same for every rule): SmolLM2 never writes the testbed's `…=N#` answers, so
its verifier gives every rollout 0 and no advantage, and nothing would train. What is tested is each rule
on this model's shapes (49,152 tokens, 30 layers, grouped-query heads 9 / 3), its statistics recorded
while transformers samples; tests/signals/test_signals_smollm2.py checks those statistics against
float64 references.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from stare_lab.config.run_config import compose, save_config
from stare_lab.core.controls import RANDOM_REWARD, control_overrides
from stare_lab.methods import list_methods
from stare_lab.record import read_eval_results, read_metrics, read_status
from stare_lab.run.runner import build_trainer

SMALL = [
    "model=smollm2",
    "trainer.per_device_train_batch_size=8",
    "trainer.num_generations=4",
    "trainer.gradient_accumulation_steps=1",
    "trainer.max_completion_length=8",
    "trainer.max_steps=2",
    "trainer.save_steps=100",
    "logger=none",
    "eval.enabled=false",
]
RULE_REWARD = ["task.reward=random"]  # see the module docstring
RULE_OVERRIDES = {"ict": ["method.params.warmup_steps=1"]}  # selective from step 2 on


def overrides_of(arm: str) -> list[str]:
    """A rule's overrides, or the random-reward control's own (stare_lab.core.controls)."""
    if arm == RANDOM_REWARD:
        return [f"{key}={value}" for key, value in control_overrides(arm)]
    return [f"method={arm}", *RULE_REWARD, *RULE_OVERRIDES.get(arm, [])]


@pytest.mark.parametrize("arm", [*list_methods(), RANDOM_REWARD])
def test_every_rule_trains_two_steps_on_smollm2(arm, smollm2_folder, tmp_path):
    cfg = compose([*SMALL, *overrides_of(arm)])
    trainer = build_trainer(cfg, tmp_path)
    assert trainer.model.config.vocab_size == 49_152 and trainer.model.config.num_key_value_heads == 3
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, f"{arm}: no parameter changed in two optimizer steps"
    logs = [h for h in trainer.state.log_history if "tokens/selected_frac" in h]
    assert len(logs) == 2
    for h in logs:
        assert 0.0 < h["tokens/selected_frac"] <= 1.0, (arm, h)
        assert torch.isfinite(torch.tensor(h["tokens/weight_mean"]))
        assert h["rewards/accuracy/mean"] == 0.0  # the verifier, at weight 0, still logs the true accuracy


def test_base_evaluates_the_untrained_smollm2(smollm2_folder, tmp_path):
    """`method=base`: 0 steps, no trainer, the converted folder itself evaluated (avg@2 on 4 held-out
    problems), the folder's hashes in the attempt's record when run by the worker."""
    from stare_lab.sweep.worker import run_one

    cfg = compose(["model=smollm2", "method=base", "logger=none", "task.heldout_size=4", "eval.n=2"])
    assert cfg.trainer.max_steps == 0
    save_config(cfg, tmp_path / "config.yaml")
    run_one(tmp_path)
    status = read_status(tmp_path)
    assert status["state"] == "finished" and status["provenance"][-1]["model"]["folder"] == str(smollm2_folder)
    assert read_metrics(tmp_path) == [] and not (tmp_path / "final").exists()
    [result] = [r for r in read_eval_results(tmp_path) if r.get("final")]
    samples = pd.read_parquet(tmp_path / "eval" / "arithmetic" / f"{result['settings_key']}.parquet")
    assert len(samples) == 4 * 2
