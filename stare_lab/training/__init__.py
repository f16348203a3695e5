"""Layer 3, one training step: the trainer on TRL's GRPO, the objective, token weights, TRL's internals, W&B tracking.
May import layers 1-2 and signals."""
