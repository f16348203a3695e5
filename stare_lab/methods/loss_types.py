"""TRL 1.16's loss types: the one list, what each one's policy term is and how it aggregates, and the
micro-batch scope's options, as plain names (no torch: the config checks read them before torch is
imported).

Every TRL 1.16 loss type composes with token weights (docs/trl_parity.md). The aggregation of each is
written once, in `stare_lab.training.objective.aggregate_tokens`.
"""

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
# Loss types whose policy term is PPO's clipped surrogate; the others (cispo, sapo, vespo) have their own.
PPO_SURROGATE = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
OWN_SURROGATE = tuple(t for t in LOSS_TYPES if t not in PPO_SURROGATE)
# How each aggregates the masked per-token loss x [B, T]:
PER_ROW_DENOMINATOR = ("grpo", "sapo")  # mean over rows of Σ_row x / (row's token count)
MICRO_BATCH_DENOMINATOR = ("bnpo",)  # Σ x / (the micro-batch's token count)
CONSTANT_DENOMINATOR = ("dr_grpo",)  # Σ x / (B · max_completion_length)
# Σ x / (the generation batch's valid-token count, `num_items_in_batch`, over every rank)
GENERATION_BATCH_DENOMINATOR = ("dapo", "cispo", "vespo")
ROW_SUM = ("luspo",)  # mean over rows of Σ_row x: no token count
# Loss types with no token-count denominator: "selected" equals "valid" for them.
NO_TOKEN_DENOMINATOR = CONSTANT_DENOMINATOR + ROW_SUM
# `scope: microbatch` (stare_lab/training/token_weights.py, docs/pitfalls.md): how the loss of a micro-batch is
# aggregated (verl's legacy dp_actor token-mean, the default, or TRL's loss type) and where a rule selects
# (per process, as the official codes, or over every rank's micro-batch, as TRL's top_entropy_quantile).
AGGREGATIONS = ("verl", "trl")
RANKS = ("process", "gathered")
