"""A run that can not learn says so: most steps without a learning signal are one warning line.

GRPO learns from differences within a group: where every rollout of a prompt gets the same reward
(all 0 with a model that never solves the task, all 1 where it always does), the group-normalised
advantages are 0 and so is the policy gradient of every token, whatever the token rule. TRL logs the
share of such groups per step as `frac_reward_zero_std`. When it is 1 (no group with a signal) in
more than half of a run's logged generation steps (a step that trains on an earlier step's batch
carries that batch's value and is not counted again), the run prints one line and puts it in its W&B summary
(`warning/no_learning_signal`): its curves and table rows then say nothing about the rule.
"""

from __future__ import annotations

from transformers import TrainerCallback

from stare_lab.training.tracking import generated_here, is_train_log

ZERO_STD_KEY = "frac_reward_zero_std"  # TRL 1.16 GRPOTrainer: share of groups whose rewards are all equal


def no_signal_warning(log_history: list[dict], label: str, share: float = 0.5) -> str | None:
    """The warning line when more than `share` of the logged train steps had no group with a signal."""
    rows = [
        e
        for e in log_history
        if is_train_log(e) and generated_here(e) and isinstance(e.get(ZERO_STD_KEY), (int, float))
    ]
    silent = sum(e[ZERO_STD_KEY] >= 1.0 for e in rows)
    if not rows or silent <= share * len(rows):
        return None
    return (
        f"warning: {label}: no learning signal in {silent} of {len(rows)} steps (in every group all rollouts got "
        "the same reward, so every advantage and every gradient was 0): check the reward, the task and the model"
    )


class LearningSignalCheck(TrainerCallback):
    """At the end of training, `no_signal_warning` over the whole run (resumed steps included)."""

    def __init__(self, label: str, wandb_run=None):
        self.label, self.wandb_run = label, wandb_run

    def on_train_end(self, args, state, control, **kwargs):
        line = no_signal_warning(state.log_history, self.label)
        if line is not None:
            print(line, flush=True)
            if self.wandb_run is not None:
                self.wandb_run.summary["warning/no_learning_signal"] = line
        return control
