"""The shared trainer set-up (tests/support/fixtures_trainer.py, conftest.py's fixtures) gives what it says."""

from __future__ import annotations

import fixtures_trainer
import torch
from fixtures_trainer import CPU, SHORT_RUN, TRL_DEFAULT, cpu_config, grpo_config
from trl import GRPOConfig

from stare_lab.tasks.arithmetic import ArithmeticTask


def test_grpo_config_is_the_short_cpu_run_with_overrides_on_top(tmp_path):
    args = grpo_config(tmp_path, learning_rate=1e-2, max_completion_length=6)
    assert args.output_dir == str(tmp_path) and args.use_cpu and not args.bf16 and args.report_to == []
    assert (args.learning_rate, args.max_completion_length) == (1e-2, 6)
    for key in set(SHORT_RUN) - {"learning_rate", "max_completion_length"}:
        assert getattr(args, key) == SHORT_RUN[key], key
    assert args.epsilon_high == 0.28 and args.logging_steps == 1


def test_trl_default_leaves_a_key_at_grpo_configs_own_value(tmp_path):
    trl = GRPOConfig(output_dir=str(tmp_path), **CPU, per_device_train_batch_size=8)
    ours = grpo_config(tmp_path, epsilon_high=TRL_DEFAULT, logging_steps=TRL_DEFAULT)
    assert ours.epsilon_high is trl.epsilon_high is None and ours.logging_steps == trl.logging_steps == 10
    plain = cpu_config(tmp_path, per_device_train_batch_size=8)
    assert plain.to_dict() == trl.to_dict()


def test_tiny_lm_repeats_and_make_trainer_trains_a_copy_of_it(tiny_lm, make_trainer):
    tok, model = tiny_lm
    _, again = fixtures_trainer.tiny_lm()
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (2, 32)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    dataset = ArithmeticTask(train_size=8, heldout_size=4).train_dataset()
    trainer = make_trainer("full", dataset, learning_rate=1e-2)
    assert trainer.model is not model and trainer.processing_class is tok and trainer.args.learning_rate == 1e-2
    assert trainer.rule.name == "full" and trainer.reward_funcs == [fixtures_trainer.length_reward]
    for a, b in zip(model.parameters(), trainer.model.parameters(), strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
