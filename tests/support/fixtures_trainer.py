"""The set-up a trainer test needs, written once: the tiny model, GRPOConfig for a short CPU run, a trainer.

- `tiny_lm()`: the tokenizer and a tiny random Qwen2 (`TINY_MODEL`: 2 layers, hidden size 32), seeded
  with 0 so every test that builds it gets the same weights.
- `builtin_lm()`: the tokenizer and the shipped, trained built-in model (stare_lab/models/builtin), for
  tests that want next-token entropies that vary from token to token.
- `grpo_config(output_dir, **overrides)`: TRL's GRPOConfig for a 2-step CPU run of 8 rows in groups of 4
  (`CPU` + `SHORT_RUN`); a test sets any other value by keyword (learning_rate=1e-2 …), and
  `TRL_DEFAULT` leaves a key at GRPOConfig's own default. `cpu_config` is the same with only `CPU`.
- `trainer_kwargs(...)` / `rule_trainer(...)`: the keyword arguments TRL's GRPOTrainer and our
  TokenRuleGRPOTrainer share, and our trainer built from them.

conftest.py wraps these as fixtures (`tiny_lm`, `builtin_lm`, `grpo_args`, `make_trainer`); the worker
processes of the distributed tests (dist_worker_*.py) import them directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from stare_lab.methods import Rule, get_method
from stare_lab.models.builtin import BUILTIN_DIR, build_model, build_tokenizer

if TYPE_CHECKING:
    from trl import GRPOConfig

    from stare_lab.training.trainer import TokenRuleGRPOTrainer

# TRL and the trainer are imported in the functions that build them, so that a worker process that
# only wants the tiny model (dist_worker_stats.py) does not load TRL.

TINY_MODEL = dict(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)

# what every test run needs on this machine: CPU, float32, no tracker
CPU: dict[str, Any] = dict(use_cpu=True, bf16=False, report_to="none")

# a short run: 2 optimizer steps, 8 rows (2 prompts x 4 completions) per step, completions of at most
# 12 tokens, a log line per step, nothing saved; epsilon_high 0.28 is the DAPO clip-higher value
SHORT_RUN: dict[str, Any] = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    gradient_accumulation_steps=1,
    max_completion_length=12,
    max_steps=2,
    learning_rate=1e-3,
    seed=0,
    logging_steps=1,
    save_strategy="no",
    disable_tqdm=True,
    epsilon_high=0.28,
)


class _TrlDefault:
    def __repr__(self) -> str:
        return "TRL_DEFAULT"


TRL_DEFAULT: Any = _TrlDefault()  # grpo_config(..., key=TRL_DEFAULT): leave the key at GRPOConfig's default


def cpu_config(output_dir: str | Path, **overrides: Any) -> GRPOConfig:
    """GRPOConfig with `CPU` and the given values; every other key at GRPOConfig's default."""
    from trl import GRPOConfig

    values = {"output_dir": str(output_dir), **CPU, **overrides}
    return GRPOConfig(**{k: v for k, v in values.items() if v is not TRL_DEFAULT})


def grpo_config(output_dir: str | Path, **overrides: Any) -> GRPOConfig:
    """GRPOConfig for the short CPU run (`CPU` + `SHORT_RUN`), with `overrides` on top."""
    return cpu_config(output_dir, **{**SHORT_RUN, **overrides})


def tiny_lm() -> tuple[Any, torch.nn.Module]:
    """(tokenizer, tiny random Qwen2); torch's generator is seeded with 0 first, so the weights repeat."""
    torch.manual_seed(0)
    tok = build_tokenizer()
    return tok, build_model(tok, **TINY_MODEL)


def builtin_lm() -> tuple[Any, torch.nn.Module]:
    """(tokenizer, the shipped trained built-in model). Seeds nothing: a test seeds its own run."""
    from transformers import Qwen2ForCausalLM

    return build_tokenizer(), Qwen2ForCausalLM.from_pretrained(BUILTIN_DIR)


def length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """A reward that varies within every group on an untrained model, so advantages are non-zero."""
    return [float(len(c) % 3) for c in completions]


def trainer_kwargs(tok: Any, model: Any, args: GRPOConfig, dataset: Any, reward: Any = length_reward) -> dict:
    """The arguments TRL's GRPOTrainer and TokenRuleGRPOTrainer share: one reward function, no eval set."""
    return dict(model=model, reward_funcs=[reward], args=args, train_dataset=dataset, processing_class=tok)


def rule_trainer(
    tok: Any,
    model: Any,
    args: GRPOConfig,
    dataset: Any,
    rule: Rule | str,
    reward: Any = length_reward,
    **trainer_kw: Any,
) -> TokenRuleGRPOTrainer:
    """TokenRuleGRPOTrainer on `model` itself (copy it first to keep the original); a rule's name is
    looked up with its default parameters; `trainer_kw` are our trainer's own (keep_batches_every, …)."""
    from stare_lab.training.trainer import TokenRuleGRPOTrainer

    return TokenRuleGRPOTrainer(
        rule=get_method(rule) if isinstance(rule, str) else rule,
        **trainer_kwargs(tok, model, args, dataset, reward),
        **trainer_kw,
    )
