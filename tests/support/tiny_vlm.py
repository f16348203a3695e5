"""A tiny random Qwen2-VL over the built-in character vocabulary, shared by the VLM loss and
statistics tests (no download: built from a config)."""

from __future__ import annotations

from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

IMAGE, VIDEO, VISION_START, VISION_END = 99, 100, 101, 102  # ids after the character vocabulary (0-98)


def tiny_qwen2_vl() -> Qwen2VLForConditionalGeneration:
    """2 text layers of width 32 (GQA 4/2 heads, mrope), a 1-block vision tower with 4-pixel patches merged 2×2."""
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=VISION_END + 1,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]},
        ),
        vision_config=dict(
            depth=1,
            embed_dim=16,
            hidden_size=32,
            num_heads=2,
            mlp_ratio=2,
            patch_size=4,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
        ),
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    return Qwen2VLForConditionalGeneration(config)
