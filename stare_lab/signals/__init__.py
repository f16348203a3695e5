"""Layer 3, the statistics of one generation batch (vocabulary, attention, JS, generation-time) and their
gathering across ranks. May import layers 1-2.

Per-token statistics of one generation batch: vocabulary entropy, attention entropy, JS to the group.

All are detached, computed in chunks (never [B, T, V] or [heads, T, T] in float32 at once), and
aligned with logits: the value at input position t describes the distribution that generates
token t+1. See docs/pitfalls_signals.md.
"""

from .attention import attention_entropy, forward_with_stats, resolve_layers
from .js import js_to_group_mean
from .statistics import token_statistics
from .vocab import lm_head_of, predictive_entropy, vocab_stats

__all__ = [
    "attention_entropy",
    "forward_with_stats",
    "js_to_group_mean",
    "lm_head_of",
    "predictive_entropy",
    "resolve_layers",
    "token_statistics",
    "vocab_stats",
]
