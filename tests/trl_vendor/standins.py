"""Local stand-ins for the hub models and datasets TRL's GRPO tests load (no network, nothing downloaded).

Models: tiny random models built from configs, with a character-level tokenizer that carries a
ChatML chat template (written here, not copied from any model), saved in the Hugging Face hub
cache layout (`models--org--name/refs/main` → `snapshots/<rev>/`) so `from_pretrained("org/name")`
resolves them offline wherever it is called (TRL, transformers, the tests). Datasets: the
prompt-only "zen" configurations as in-memory datasets with the same columns and splits.
"""
from __future__ import annotations

import importlib.util
import json
import string
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ORG = "trl-internal-testing"
REVISION = "0" * 40
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|vision_start|>",
            "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<think>", "</think>"]
CHARS = [*string.digits, *string.ascii_letters, *string.punctuation, "\u0120", "\u010a"]  # Ġ Ċ: space, newline

# ChatML (written for these stand-ins); an image is IMAGE_SLOT, which each processor expands; tool calls as
# <tool_call> JSON, tool results as a user turn in <tool_response>. transformers renders with trim_blocks, so a
# newline right after a block tag is written as an expression.
IMAGE_SLOT = "<|vision_start|><|image_pad|><|vision_end|>"
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools><|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message.role == 'system') %}"
    "{%- set role = 'user' if message.role == 'tool' else message.role %}"
    "<|im_start|>{{ role }}\n"
    "{% if message.role == 'tool' %}<tool_response>\n{% endif %}"
    "{% if message.content is string %}{{ message.content }}"
    "{% elif message.content %}{% for part in message.content %}"
    "{% if part.type == 'image' %}" + IMAGE_SLOT + "{% elif part.type == 'text' %}{{ part.text }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}{{ '\\n' }}<tool_call>\n"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}\n</tool_call>{% endfor %}{% endif %}"
    "{% if message.role == 'tool' %}{{ '\\n' }}</tool_response>{% endif %}<|im_end|>{{ '\\n' }}"
    "{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


QWEN_ENDOFTEXT = 151643  # Qwen2.5's ids of <|endoftext|>, <|im_start|>, <|im_end|>: TRL's tests write them literally


def tokenizer(qwen_ids: bool = False):
    """One token per character plus the chat specials; qwen_ids: Qwen2.5's vocabulary size and special-token ids
    (the characters, then unused filler tokens up to 151643), so tests that fake generations with Qwen's ids,
    or rely on a random model hardly ever sampling EOS, behave as with the real tiny Qwen2.5."""
    from transformers import PreTrainedTokenizerFast

    tokens = [*CHARS, *(f"<f{i}>" for i in range(QWEN_ENDOFTEXT - len(CHARS))), *SPECIALS, "<unk>"] if qwen_ids \
        else [*SPECIALS, "<unk>", *CHARS]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in [*SPECIALS, "<unk>"]])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token="<unk>", model_max_length=4096)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _ids(tok):
    return dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                bos_token_id=tok.convert_tokens_to_ids("<|im_start|>"))


def _small(**extra):
    return dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, **extra)


def _text(config_cls, model_cls, qwen_sized=False, **config):
    def build(qwen_ids=False):
        from transformers import GenerationConfig

        tok = tokenizer(qwen_ids and qwen_sized)
        model = getattr(__import__("transformers", fromlist=[model_cls]), model_cls)(
            getattr(__import__("transformers", fromlist=[config_cls]), config_cls)(**_ids(tok), **config))
        model.generation_config = GenerationConfig(**_ids(tok), do_sample=True)
        return model, tok
    return build


def _qwen_vl(config_cls, model_cls, processor_cls):
    def build(qwen_ids=False):
        import transformers as tf

        tok = tokenizer()
        special = {k: tok.convert_tokens_to_ids(v) for k, v in dict(
            image_token_id="<|image_pad|>", video_token_id="<|video_pad|>",
            vision_start_token_id="<|vision_start|>", vision_end_token_id="<|vision_end|>").items()}
        text = dict(_small(), vocab_size=len(tok), rope_scaling={"type": "mrope", "mrope_section": [1, 1, 0]},
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                    bos_token_id=tok.convert_tokens_to_ids("<|im_start|>"))
        vision = dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, mlp_ratio=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, in_channels=3, out_hidden_size=16,
                      intermediate_size=32, fullatt_block_indexes=[0])
        config = getattr(tf, config_cls)(text_config=text, vision_config=vision, **special)
        model = getattr(tf, model_cls)(config)
        model.generation_config = tf.GenerationConfig(**_ids(tok), do_sample=True)
        image = tf.Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
        try:
            video = tf.Qwen2VLVideoProcessor()
        except ImportError:  # it needs torchvision; the tests pass images only
            video = None
        processor = getattr(tf, processor_cls)(image_processor=image, tokenizer=tok, video_processor=video,
                                               chat_template=CHAT_TEMPLATE)
        return model, processor
    return build


def _gemma3(qwen_ids=False):
    import transformers as tf

    extra = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}
    base = tokenizer()
    base.add_special_tokens({"additional_special_tokens": list(extra.values())})
    template = CHAT_TEMPLATE.replace(IMAGE_SLOT, extra["boi_token"])
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, eos_token="<|im_end|>",
                                     pad_token="<|endoftext|>", unk_token="<unk>", extra_special_tokens=extra)
    tok.chat_template = template
    token = tok.convert_tokens_to_ids
    text = dict(_small(head_dim=4, sliding_window=64), vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id, bos_token_id=token("<|im_start|>"))
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14, vision_use_head=False)  # Gemma 3 reads the patch embeddings, not a pooled head
    config = tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                             boi_token_index=token(extra["boi_token"]), eoi_token_index=token(extra["eoi_token"]),
                             image_token_index=token(extra["image_token"]))
    model = tf.Gemma3ForConditionalGeneration(config)
    model.generation_config = tf.GenerationConfig(**_ids(tok), do_sample=True)
    image = tf.Gemma3ImageProcessor(size={"height": 28, "width": 28})
    return model, tf.Gemma3Processor(image_processor=image, tokenizer=tok, chat_template=template, image_seq_length=4)


STANDINS = {
    f"{ORG}/tiny-Qwen2ForCausalLM-2.5": _text("Qwen2Config", "Qwen2ForCausalLM", qwen_sized=True,
                                              **_small(tie_word_embeddings=True)),
    f"{ORG}/tiny-Qwen2ForSequenceClassification-2.5": _text("Qwen2Config", "Qwen2ForSequenceClassification",
                                                            qwen_sized=True, **_small(num_labels=1)),
    f"{ORG}/tiny-Qwen3ForCausalLM": _text("Qwen3Config", "Qwen3ForCausalLM", **_small(head_dim=4)),
    f"{ORG}/tiny-Qwen3ForSequenceClassification": _text("Qwen3Config", "Qwen3ForSequenceClassification",
                                                        **_small(head_dim=4, num_labels=1)),
    f"{ORG}/tiny-Qwen3MoeForCausalLM": _text("Qwen3MoeConfig", "Qwen3MoeForCausalLM", **_small(
        head_dim=4, moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.001)),
    f"{ORG}/tiny-LlamaForCausalLM-3.2": _text("LlamaConfig", "LlamaForCausalLM", **_small(tie_word_embeddings=True)),
    f"{ORG}/tiny-LlamaForSequenceClassification-3.2": _text("LlamaConfig", "LlamaForSequenceClassification",
                                                           **_small(num_labels=1)),
    f"{ORG}/tiny-MistralForCausalLM-0.2": _text("MistralConfig", "MistralForCausalLM", **_small()),
    f"{ORG}/tiny-Gemma2ForCausalLM": _text("Gemma2Config", "Gemma2ForCausalLM", **_small(head_dim=4)),
    f"{ORG}/tiny-Cohere2ForCausalLM": _text("Cohere2Config", "Cohere2ForCausalLM", **_small()),
    f"{ORG}/tiny-GptOssForCausalLM": _text("GptOssConfig", "GptOssForCausalLM", **_small(
        head_dim=4, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.001,
        layer_types=["sliding_attention", "full_attention"], sliding_window=64)),
    f"{ORG}/tiny-Gemma3ForConditionalGeneration": _gemma3,
}
_QWEN_VL = {
    f"{ORG}/tiny-Qwen2VLForConditionalGeneration": _qwen_vl("Qwen2VLConfig", "Qwen2VLForConditionalGeneration",
                                                            "Qwen2VLProcessor"),
    f"{ORG}/tiny-Qwen2_5_VLForConditionalGeneration": _qwen_vl("Qwen2_5_VLConfig",
                                                               "Qwen2_5_VLForConditionalGeneration",
                                                               "Qwen2_5_VLProcessor"),
}
# model id → why no stand-in is served (the tests naming it are skipped with this reason)
MISSING = {
    f"{ORG}/tiny-RemoteForCausalLM": "its modeling code is hub code (trust_remote_code)",
    f"{ORG}/tiny-NemotronHForCausalLM-nano": "no stand-in written (hybrid Mamba)",
    f"{ORG}/tiny-Glm4MoeForCausalLM": "no stand-in written",
    f"{ORG}/tiny-Gemma4ForConditionalGeneration": "no stand-in written",
    f"{ORG}/tiny-LlavaForConditionalGeneration": "no stand-in written",
    f"{ORG}/tiny-LlavaNextForConditionalGeneration": "no stand-in written",
    f"{ORG}/tiny-SmolVLMForConditionalGeneration": "no stand-in written",
    f"{ORG}/tiny-Qwen3_5ForConditionalGeneration-NoThink": "no stand-in written",
    f"{ORG}/tiny-Qwen3_5MoeForConditionalGeneration-3.6": "no stand-in written",
}
if importlib.util.find_spec("torchvision") is not None:
    STANDINS.update(_QWEN_VL)
else:  # transformers 5 loads Qwen2-VL's processor only with its video processor, which needs torchvision
    MISSING.update({model_id: "its processor needs torchvision (not installed)" for model_id in _QWEN_VL})


# Tests that need the Qwen-sized vocabulary (ids written literally, or "a random model almost never samples EOS");
# only they get it: a 151k vocabulary makes every training step about 20× slower on CPU.
QWEN_IDS_TESTS = ("test_train_with_mask_truncated_completions",)
QWEN_SIZED = (f"{ORG}/tiny-Qwen2ForCausalLM-2.5", f"{ORG}/tiny-Qwen2ForSequenceClassification-2.5")


def build_hub_cache(root: Path, qwen_ids: bool = False) -> dict[str, str]:
    """Saves the stand-ins under `root` in the hub cache layout (qwen_ids: only the Qwen2.5 pair, Qwen-sized);
    returns {model id: error} for those that failed to build."""
    failed = {}
    for model_id, build in STANDINS.items():
        if qwen_ids and model_id not in QWEN_SIZED:
            continue
        repo = root / f"models--{model_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / REVISION
        try:
            model, processing = build(qwen_ids)
            model.save_pretrained(snapshot)
            processing.save_pretrained(snapshot)
        except Exception as e:  # a missing architecture in this transformers: the tests naming it are skipped
            failed[model_id] = f"{type(e).__name__}: {e}"
            continue
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
    return failed


# ---- datasets -----------------------------------------------------------------------------
# Openings of the Zen of Python's lines (PEP 20), like TRL's "zen" (a test checks the first twelve, in order).
PROMPTS = ["Beautiful is better than", "Explicit is", "Simple is better", "Complex", "Flat is better than",
           "Sparse is better", "Readability", "Special cases aren't special", "Although practicality beats",
           "Errors should never", "Unless explicitly", "In the face of ambiguity, refuse",
           "There should be one-- and preferably", "Although that way may not", "Now is better",
           "Although never is", "If the implementation is hard to explain,"]
TEST_PROMPTS = ["If the implementation is easy to explain,", "Namespaces are one"]


def _image(seed: int, size=(32, 32)):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8))


def zen(name: str, config: str) -> dict:
    """{split: rows} of the stand-in for `trl-internal-testing/<name>`, configuration `config`."""
    splits = {"train": PROMPTS, "test": TEST_PROMPTS}
    if name == "zen" and config == "standard_prompt_only":
        return {s: [{"prompt": p} for p in ps] for s, ps in splits.items()}
    if name == "zen" and config == "conversational_prompt_only":
        return {s: [{"prompt": [{"role": "user", "content": p}]} for p in ps] for s, ps in splits.items()}
    if name == "zen-image" and config == "conversational_prompt_only":
        return {s: [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": p}]}],
                     "image": _image(i)} for i, p in enumerate(ps)] for s, ps in splits.items()}
    if name == "zen-multi-image" and config == "conversational_prompt_only":
        two = [{"type": "image"}, {"type": "image"}]
        return {s: [{"prompt": [{"role": "user", "content": [*two, {"type": "text", "text": p}]}],
                     "images": [_image(i), _image(100 + i, (28, 40))]} for i, p in enumerate(ps)]
                for s, ps in splits.items()}
    raise FileNotFoundError(f"no local stand-in for dataset {ORG}/{name} ({config})")


def load_dataset(path, name=None, *, split=None, streaming=False, **kwargs):
    """`datasets.load_dataset` for the stand-in datasets (same splits, columns, streaming)."""
    from datasets import Dataset, DatasetDict, IterableDatasetDict

    if not str(path).startswith(f"{ORG}/"):
        raise FileNotFoundError(f"no local stand-in for dataset {path}")
    rows = zen(str(path).split("/", 1)[1], name)
    data = {s: Dataset.from_list(r) for s, r in rows.items()}
    if streaming:
        data = {s: d.to_iterable_dataset() for s, d in data.items()}
    if split is not None:
        return data[split]
    return IterableDatasetDict(data) if streaming else DatasetDict(data)


def write_manifest(root: Path, failed: dict[str, str]) -> None:
    (root / "standins.json").write_text(json.dumps({"built": sorted(set(STANDINS) - set(failed)),
                                                    "failed": failed}, indent=1))
