"""The LoRA section of a run's config (`model.lora`): its keys, their defaults and ranges.

It lives with the models, which wrap the policy with it (`stare_lab.models._wrap_lora`), and the
config schema (stare_lab.config.schema) imports it from here: config/ may import models/, not the
other way round (tests/test_layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoraConfig:
    """A LoRA adapter on the policy (peft.LoraConfig). `model.lora: null` trains every weight; any
    LoRA key (`model.lora.r: 16`, or a mapping `model.lora: {r: 16}`) turns it on, the other keys
    taking these values (the one place they are set)."""

    r: int = field(default=8, metadata={"ge": 1})  # the adapter's rank
    alpha: float = field(default=16.0, metadata={"gt": 0})  # scale alpha / r
    dropout: float = field(default=0.0, metadata={"ge": 0, "lt": 1})
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
