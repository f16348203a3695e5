"""Layer 2, the models: the built-in model and its training, any causal LM by hub name or path, LoRA.
May import layer 1 and config.

Loading models: the shipped built-in model, or any causal LM by hub name or local path."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TokenizersBackend

from stare_lab.config.schema import LoraConfig as Schema
from stare_lab.models.builtin import BUILTIN_DIR

__all__ = ["BUILTIN_DIR", "load_model_and_tokenizer", "resolve_model_path"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _looks_local(name: str) -> bool:
    return name.startswith(("/", ".", "~"))


def resolve_model_path(name_or_path: str) -> str | Path:
    """What ``from_pretrained`` loads for ``model.name_or_path``: the built-in model's folder, a local
    folder (a name starting with ``/``, ``.`` or ``~``, which never reaches the hub), or a hub name."""
    if name_or_path == "builtin":
        if not (BUILTIN_DIR / "model.safetensors").is_file():
            raise ValueError(f"built-in model missing at {BUILTIN_DIR}: run python -m stare_lab.models.train_builtin")
        return BUILTIN_DIR
    if _looks_local(name_or_path):
        local = Path(name_or_path).expanduser()
        if not local.is_dir():
            raise ValueError(f"model path {name_or_path!r} does not exist (resolved to {local.resolve()})")
        return local
    return name_or_path


def load_model_and_tokenizer(
    name_or_path: str = "builtin",
    *,
    dtype: str = "float32",
    lora: dict | None = None,
    attn_implementation: str | None = None,
):
    """Return ``(model, tokenizer)``; the tokenizer pads on the left, with EOS as pad if it has none.

    ``"builtin"`` is the model shipped in ``stare_lab/models/builtin``. A name starting with
    ``/``, ``.`` or ``~`` is a local directory and never reaches the hub. ``lora`` =
    ``{"r", "alpha", "dropout", "target_modules"}`` wraps the model with peft's LoRA.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(_DTYPES)}")
    path = str(resolve_model_path(name_or_path))
    kwargs: dict[str, Any] = {"dtype": _DTYPES[dtype]}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    tokenizer = _load_tokenizer(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if lora is not None:
        model = _wrap_lora(model, lora)
    return model, tokenizer


def _load_tokenizer(path: str):
    # transformers 5 overrides a saved "TokenizersBackend" class with the model type's own
    # tokenizer class (Qwen2Tokenizer for qwen2); honour the saved class for local directories.
    config = Path(path) / "tokenizer_config.json"
    if config.is_file() and '"TokenizersBackend"' in config.read_text():
        return TokenizersBackend.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def _wrap_lora(model, lora: dict):
    """peft's LoRA with the run's `model.lora` (stare_lab.config.schema.LoraConfig: keys and defaults)."""
    from peft import LoraConfig, get_peft_model  # deferred: peft, only a LoRA run needs it

    known = {f.name for f in dataclasses.fields(Schema)}
    if set(lora) - known:
        raise ValueError(f"unknown LoRA keys {sorted(set(lora) - known)}; known: {', '.join(sorted(known))}")
    lora = {**dataclasses.asdict(Schema()), **lora}
    config = LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=list(lora["target_modules"]),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)
