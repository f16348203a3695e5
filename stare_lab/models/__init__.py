"""Layer 2, the models: the built-in model and its training, SmolLM2-135M-Instruct, any causal LM by hub name, LoRA.
May import layer 1.

Loading models: the packaged ones (the built-in model; SmolLM2-135M-Instruct, converted from its pip
wheel: docs/models.md), or any causal LM by hub name or local path.

Importing this package loads no torch: the launch check (stare_lab.config.inputs) asks
`packaged_problems`, and the config schema reads the LoRA section (`models/lora.py`); the loaders
import torch and transformers inside.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stare_lab.models import smollm2
from stare_lab.models.builtin import BUILTIN_DIR
from stare_lab.models.lora import LoraConfig as Schema
from stare_lab.record.provenance import read_model_source

__all__ = [
    "BUILTIN_DIR",
    "PACKAGED",
    "load_model_and_tokenizer",
    "model_source",
    "packaged_problems",
    "resolve_model_path",
]

# model.name_or_path values that name a model of the package, never the hub
PACKAGED = ("builtin", smollm2.NAME)
_DTYPES = ("float32", "bfloat16", "float16")


def _looks_local(name: str) -> bool:
    return name.startswith(("/", ".", "~"))


def resolve_model_path(name_or_path: str) -> str | Path:
    """What ``from_pretrained`` loads for ``model.name_or_path``: a packaged model's folder (``smollm2``'s
    converted on first use, and checked against its hashes), a local folder (a name starting with ``/``,
    ``.`` or ``~``, which never reaches the hub), or a hub name."""
    if name_or_path == "builtin":
        if problems := packaged_problems("builtin"):
            raise ValueError(problems[0])
        return BUILTIN_DIR
    if name_or_path == smollm2.NAME:
        return smollm2.prepared_folder()
    if _looks_local(name_or_path):
        local = Path(name_or_path).expanduser()
        if not local.is_dir():
            raise ValueError(f"model path {name_or_path!r} does not exist (resolved to {local.resolve()})")
        return local
    return name_or_path


def packaged_problems(name: str) -> list[str]:
    """Why a packaged model (a name of `PACKAGED`) can not be loaded, one line each; empty: it can.
    Reads and hashes files only, never imports torch (the launch check, stare_lab.config.inputs)."""
    if name == "builtin":
        if (BUILTIN_DIR / "model.safetensors").is_file():
            return []
        return [f"built-in model missing at {BUILTIN_DIR}: run python -m stare_lab.models.train_builtin"]
    return smollm2.problems()


def model_source(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The attempt's `model` in the run record (stare_lab.record.read_model_source) when a run's config
    names a model converted from a packaged file, converting it first if need be; None for any other."""
    name = (cfg.get("model") or {}).get("name_or_path")
    return read_model_source(resolve_model_path(name)) if name in PACKAGED else None


def load_model_and_tokenizer(
    name_or_path: str = "builtin",
    *,
    dtype: str = "float32",
    lora: dict | None = None,
    attn_implementation: str | None = None,
):
    """Return ``(model, tokenizer)``; the tokenizer pads on the left, with EOS as pad if it has none.

    ``"builtin"`` is the model shipped in ``stare_lab/models/builtin``, ``"smollm2"`` SmolLM2-135M-Instruct's
    converted folder (stare_lab.models.smollm2). A name starting with
    ``/``, ``.`` or ``~`` is a local directory and never reaches the hub. ``lora`` =
    ``{"r", "alpha", "dropout", "target_modules"}`` wraps the model with peft's LoRA.
    """
    import torch  # deferred: torch, transformers; importing stare_lab.models stays torch-free (the launch check)
    from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(_DTYPES)}")
    path = str(resolve_model_path(name_or_path))
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
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
    from transformers import AutoTokenizer, TokenizersBackend  # deferred: transformers, as in the caller

    # transformers 5 overrides a saved "TokenizersBackend" class with the model type's own
    # tokenizer class (Qwen2Tokenizer for qwen2); honour the saved class for local directories.
    config = Path(path) / "tokenizer_config.json"
    if config.is_file() and '"TokenizersBackend"' in config.read_text():
        return TokenizersBackend.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def _wrap_lora(model, lora: dict):
    """peft's LoRA with the run's `model.lora` (stare_lab.models.lora.LoraConfig: keys and defaults)."""
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
