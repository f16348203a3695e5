"""TRL 1.16's loss types and how each aggregates, as plain names (no torch: config checks read them)."""

# Every TRL 1.16 loss type composes with token weights (docs/trl_parity.md).
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
# Loss types whose denominator is the generation batch's valid-token count (`num_items_in_batch`).
GENERATION_BATCH_DENOMINATOR = ("dapo", "cispo", "vespo")
# Loss types with no token-count denominator: "selected" equals "valid" for them.
NO_TOKEN_DENOMINATOR = ("dr_grpo", "luspo")
