"""A run whose groups carry no learning signal for most steps says so in one line and in W&B."""

from __future__ import annotations

from wandb_files import final_summary, run_records

from stare_lab.config.run_config import compose, save_config
from stare_lab.record import read_metrics
from stare_lab.run.runner import execute
from stare_lab.training.learning_signal import no_signal_warning


def _logs(*zero_std: float) -> list[dict]:
    return [{"step": i + 1, "reward": 0.0, "frac_reward_zero_std": z} for i, z in enumerate(zero_std)] + [
        {"train_runtime": 1.0}  # the end-of-training summary: not a step
    ]


def test_the_warning_counts_steps_without_any_group_with_a_signal():
    line = no_signal_warning(_logs(1.0, 1.0, 0.75), "stare s0")
    assert line is not None and line.startswith("warning: stare s0: no learning signal in 2 of 3 steps")
    assert no_signal_warning(_logs(1.0, 0.75, 0.75), "x") is None  # one of three: a signal most of the time
    assert no_signal_warning(_logs(1.0, 1.0, 0.5, 0.0), "x") is None  # exactly half: not "most"
    assert no_signal_warning(_logs(), "x") is None


def test_a_run_that_can_not_learn_warns_in_its_log_and_its_wandb_summary(tmp_path, capfd):
    # one completion token can never hold an arithmetic answer: every reward is 0 in every group
    cfg = compose(
        ["logger=wandb_offline", "trainer.max_steps=2", "trainer.max_completion_length=1", "eval.enabled=false"]
    )
    run_dir = tmp_path / cfg.run.id
    save_config(cfg, run_dir / "config.yaml")
    execute(run_dir)
    assert [r["reward"] for r in read_metrics(run_dir)] == [0.0, 0.0]
    (line,) = [x for x in capfd.readouterr().out.splitlines() if x.startswith("warning:")]
    assert line.startswith(f"warning: {cfg.method.name} s{cfg.seed}: no learning signal in 2 of 2 steps")
    assert final_summary(run_records(run_dir / "wandb", cfg.run.id))["warning/no_learning_signal"] == line
