"""stare_lab: token-level RLVR ablations on one TRL GRPO trainer core."""

__version__ = "0.1.0"
