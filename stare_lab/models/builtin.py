"""The built-in model: a tiny Qwen2 causal LM with a character-level tokenizer.

Same architecture family as the real targets (Qwen2.5: RoPE, RMSNorm, SwiGLU, grouped-query
attention), so every code path the trainer exercises on a real model is exercised here, at a
size that trains and runs RL on two CPU cores. The weights shipped in ``builtin/`` are produced
by ``python -m stare_lab.models.train_builtin``.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

BUILTIN_DIR = Path(__file__).with_name("builtin")

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
# Printable ASCII, so any plain-text prompt round-trips, not just the arithmetic alphabet. Space
# and newline are spelled as their byte-level symbols (GPT-2's byte-to-unicode map is the
# identity on the other printable ASCII characters).
CHARS = [*string.digits, *string.ascii_letters, *string.punctuation, "\u0120", "\u010a"]  # Ġ Ċ


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; ids 0-2 are ``<pad>``, ``<eos>``, ``<unk>``.

    A BPE model without merges splits text into characters. No BOS and no post-processor: a
    prompt encodes to exactly its characters.

    Deviation from the plain char-level recipe (no pre-tokenizer, Fuse decoder): transformers 5
    reloads any tokenizer saved next to a ``qwen2`` config as ``Qwen2Tokenizer``, which imposes a
    byte-level pre-tokenizer and decoder and would silently drop spaces. Using the byte-level
    pre-tokenizer and decoder here (without its regex split) makes ``AutoTokenizer`` on a saved
    checkpoint and this object encode and decode identically.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # deferred: transformers' tokenizers
    from transformers import PreTrainedTokenizerFast  # deferred: transformers; `BUILTIN_DIR` is read without it

    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *CHARS])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([PAD, EOS, UNK])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=64,
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    max_positions: int = 64,
) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 with grouped-query attention (2 heads share a KV head)."""
    # deferred: transformers; the launch check (stare_lab.config.inputs) reads `BUILTIN_DIR` without torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_theta": 10_000.0, "rope_type": "default"},  # what `rope_theta=10_000.0` became
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        max_new_tokens=24,
    )
    return model
