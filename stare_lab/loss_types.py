"""TRL 1.16's loss types and how each aggregates, and the micro-batch scope's options, as plain names (no
torch: the config checks read them before torch is imported)."""

# Every TRL 1.16 loss type composes with token weights (docs/trl_parity.md).
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
# Loss types whose denominator is the generation batch's valid-token count (`num_items_in_batch`).
GENERATION_BATCH_DENOMINATOR = ("dapo", "cispo", "vespo")
# Loss types with no token-count denominator: "selected" equals "valid" for them.
NO_TOKEN_DENOMINATOR = ("dr_grpo", "luspo")
# `scope: microbatch` (stare_lab/token_weights.py, docs/pitfalls.md): how the loss of a micro-batch is
# aggregated (verl's legacy dp_actor token-mean, the default, or TRL's loss type) and where a rule selects
# (per process, as the official codes, or over every rank's micro-batch, as TRL's top_entropy_quantile).
AGGREGATIONS = ("verl", "trl")
RANKS = ("process", "gathered")
