"""The one module that knows TRL's private internals (read from TRL 1.16.0; docs/trl_parity.md).

TRL's GRPOTrainer has no hook for what a token rule needs: its weights inside the loss, the
statistics of a rollout while it is generated, the old-log-prob forward shared with the statistics.
Every place stare_lab reaches past TRL's public API is below, in `REACHES`, with the TRL function
whose source it was read from and that source's hash (sha256 of `inspect.getsource`, first 16 hex
digits) in TRL_VERSION; tests/training/test_trl_internals.py fails when TRL changes any of them. Nowhere
else in stare_lab is a method or attribute of a live object replaced at run time: the functions
of this module do it, for one call, and restore it on exit (also after an error).

 #  what                                            how          read from (its source hash)
 1  GRPOTrainer._generate_and_score_completions     override     itself: the batch dict it returns
                                                    (GRPOSteps)
 2  GRPOTrainer._compute_loss                       override,    itself: the per-token mask slot, the order
                                                    called,      of its factors, its denominators (computed
                                                    mirrored     the same way by trl_loss: selected_scale,
                                                                 verl_scale, surrogate_change, trl_aggregate)
 3  GRPOTrainer.get_high_entropy_mask               replaced     _compute_loss: the slot the weights use
    + top_entropy_quantile (set to 0)               per call
 4  GRPOTrainer._get_per_token_logps_and_entropies  replaced     itself (signature) and _compute_loss (its
                                                    per call     first call is the policy forward) and
                                                                 _generate_and_score_completions (the
                                                                 old-log-prob call, no grad, self.model)
 5  GRPOTrainer._generate_single_turn               replaced     itself: one call per transformers generate
                                                    per call
 6  the old-log-prob forward's condition            mirrored     _generate_and_score_completions
 7  generation paths: use_transformers_continuous_  read         _generate_single_turn, _generate
    batching, rollout_func, tools
 8  GRPOTrainer._metrics                            read, write  log: the rows it averages per logged step
 9  GRPOTrainer._step                               read         training_step and _prepare_inputs: the
                                                                 micro-batch counter and the buffer reuse
10  entropy_coef, _last_world_entropy,              saved,       _compute_loss: the adaptive entropy
    _entropy_window_stats                           restored     controller an extra loss call would move
11  trl.generation.vllm_generation.LLM              replaced     VLLMGeneration._init_vllm: the engine
                                                    (module)     TRL builds (vllm_engine: dtype, seed)
12  transformers Trainer._save_checkpoint,          override,    Trainer._save_checkpoint (transformers
    _get_output_dir                                 called       TRANSFORMERS_VERSION): the folder, and
                                                    (GRPOSteps)  trainer_state.json written last
13  a generation batch's rows over ranks            mirrored     RepeatSampler, _get_train_sampler and
    (signals/distributed.py: global row = rank·B + i)                    _generate_and_score_completions'
                                                                 process_slice
14  the multimodal inputs of a forward, cut per     mirrored     _get_per_token_logps_and_entropies
    row range (signals/statistics.py)

Rows 13 and 14 touch no private member: stare_lab computes what TRL's private code does, so a change
there would change our numbers silently; their hashes make it loud. Public attributes of GRPOTrainer
(epsilon_low, beta, num_generations, temperature, eos_token_ids, use_vllm, ...) are not listed.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig, GRPOTrainer

TRL_VERSION = "1.16.0"
TRANSFORMERS_VERSION = "5.24.0"


class GRPOSteps(GRPOTrainer):
    """TRL's GRPOTrainer with the private methods a token rule overrides mapped onto named steps
    (reaches 1, 2, 12), so that the trainer (stare_lab/training/trainer.py) names none of TRL's private methods.

    TRL calls `_generate_and_score_completions` once per generation batch (from `_prepare_inputs`) and
    `_compute_loss` once per micro-batch (from `compute_loss`); transformers calls `_save_checkpoint`.
    A subclass defines `generation_batch`, `micro_batch_loss` and `before_checkpoint`; by default each is
    TRL's own. `trl_generation_batch` is TRL's generation, scoring and advantages.
    """

    # What TRL's __init__ sets, typed as a GRPO trainer has them: transformers types `args` as any Trainer's
    # TrainingArguments and `model` as optional; GRPOConfig types num_generations and max_completion_length
    # as optional, but TRL divides by the one and pads to the other, so a constructed trainer has both.
    args: GRPOConfig
    model: nn.Module
    num_generations: int
    max_completion_length: int

    @property
    def steps_per_generation(self) -> int:
        """Micro-batches per generation batch on each process (GRPOConfig.__post_init__ resolves it from
        generation_batch_size or gradient_accumulation_steps, so it is never None once the config exists)."""
        steps = self.args.steps_per_generation
        assert steps is not None, "GRPOConfig resolves steps_per_generation in __post_init__"
        return steps

    def _generate_and_score_completions(self, inputs):  # reach 1
        return self.generation_batch(inputs)

    def _compute_loss(self, model, inputs):  # reach 2
        return self.micro_batch_loss(model, inputs)

    def _save_checkpoint(self, model, trial):  # reach 12
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            self.before_checkpoint(folder)
        super()._save_checkpoint(model, trial)

    def trl_generation_batch(self, inputs) -> dict:
        """TRL's generation batch: generate, score, group advantages (and old/ref log-probs when TRL needs them)."""
        return super()._generate_and_score_completions(inputs)

    def generation_batch(self, inputs) -> dict:
        """One generation batch, the dict TRL shuffles and splits into micro-batches."""
        return self.trl_generation_batch(inputs)

    def micro_batch_loss(self, model, inputs) -> Tensor:
        """The loss one micro-batch back-propagates."""
        return super()._compute_loss(model, inputs)

    def before_checkpoint(self, folder: Path) -> None:
        """Called with the checkpoint folder on the saving process, before transformers writes the checkpoint
        (and marks it complete by writing trainer_state.json, near the end of `Trainer._save_checkpoint`)."""


@dataclass(frozen=True)
class Reach:
    """One place stare_lab depends on TRL's (or transformers') private code."""

    number: int  # its row in the module docstring's table
    read_from: str  # "module:Qualified.name" of the function whose source it was read from
    source_hash: str  # sha256 of that function's source in TRL_VERSION, first 16 hex digits
    names: tuple[str, ...] = ()  # private names that function's source must still contain


REACHES: tuple[Reach, ...] = (
    Reach(1, "trl:GRPOTrainer._generate_and_score_completions", "1fa48922792dcd5c"),
    Reach(2, "trl:GRPOTrainer._compute_loss", "80295546bbdbf6f7", ("self.get_high_entropy_mask(",)),
    Reach(3, "trl:GRPOTrainer.get_high_entropy_mask", "ce6e86287bac23d6"),
    Reach(4, "trl:GRPOTrainer._get_per_token_logps_and_entropies", "ea73c3909275851d"),
    Reach(5, "trl:GRPOTrainer._generate_single_turn", "e0f02e4fc094cefd"),
    Reach(
        6,
        "trl:GRPOTrainer._generate_and_score_completions",
        "1fa48922792dcd5c",
        ("self.args.gradient_accumulation_steps % generate_every != 0", "self._get_per_token_logps_and_entropies("),
    ),
    Reach(7, "trl:GRPOTrainer._generate", "2a27fdf8f5e6f356", ("self.rollout_func", "self._generate_single_turn(")),
    Reach(8, "trl:GRPOTrainer.log", "1e7772819cc8cf09", ("self._metrics[mode]",)),
    Reach(9, "trl:GRPOTrainer._prepare_inputs", "f824e7fb07147956", ("self._step",)),
    Reach(9, "trl:GRPOTrainer.training_step", "9e18632f7dd8e8d8", ("self._step += 1",)),
    Reach(
        10,
        "trl:GRPOTrainer._compute_loss",
        "80295546bbdbf6f7",
        ("self._last_world_entropy", "self._entropy_window_stats"),
    ),
    Reach(11, "trl.generation.vllm_generation:VLLMGeneration._init_vllm", "0e584002e0f6a9c0", ("LLM(",)),
    Reach(12, "transformers:Trainer._save_checkpoint", "a9111e30faa99339", ("self._get_output_dir(",)),
    Reach(13, "trl.trainer.utils:RepeatSampler", "ba139f4a43eeecd4"),
    Reach(13, "trl:GRPOTrainer._get_train_sampler", "36497afb4d311dc9"),
    Reach(13, "trl:GRPOTrainer._generate_and_score_completions", "1fa48922792dcd5c", ("process_slice",)),
    Reach(14, "trl:GRPOTrainer._get_per_token_logps_and_entropies", "ea73c3909275851d", ("num_images",)),
)


def resolve(read_from: str) -> Any:
    """The function a `Reach.read_from` names."""
    module, qualified = read_from.split(":")
    obj: Any = importlib.import_module(module)
    for part in qualified.split("."):
        obj = getattr(obj, part)
    return obj


def source_hash(fn: Any) -> str:
    """sha256 of a function's source (decorators unwrapped by inspect), first 16 hex digits."""
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]


@contextmanager
def _replaced(obj: object, name: str, make: Callable[[Callable], Callable]) -> Iterator[None]:
    """`obj.<name>` is `make(current obj.<name>)` inside the block, an instance attribute restored on exit."""
    had, before = name in vars(obj), vars(obj).get(name)
    setattr(obj, name, make(getattr(obj, name)))
    try:
        yield
    finally:
        if had:
            setattr(obj, name, before)
        else:
            delattr(obj, name)


# ---- 2, 3, 4: TRL's loss with weights in its per-token mask slot ----------------------------------
# A callable gets (logp, entropies) of TRL's own forward inside `_compute_loss` (both [B, T], logp with grad)
# and is evaluated when TRL reaches the slot: a rule of scope "microbatch" selects from that forward.
Weights = Tensor | Callable[[Tensor, Tensor], Tensor]


@contextmanager
def weight_slot(
    trainer: GRPOTrainer, weights: Weights, on_entropies: Callable[[Tensor, Tensor], None] | None = None
) -> Iterator[None]:
    """For the calls inside, TRL's per-token mask slot returns `weights` [B, T] (reaches 2-4).

    `get_high_entropy_mask` is replaced on the instance and `top_entropy_quantile` < 1 arms the slot;
    both are restored on exit. A callable `weights` also sees the first forward's log-probs
    (`_get_per_token_logps_and_entropies`, replaced for the block). `on_entropies(entropies, mask)`
    sees the training forward's per-token entropies (for metrics) without a second forward.
    """
    if "get_high_entropy_mask" in vars(trainer):
        raise RuntimeError("the token-weight slot is already armed (nested weight_slot)")
    forward: dict[str, Tensor] = {}

    def slot(entropies: Tensor, mask: Tensor, threshold: float) -> Tensor:
        if on_entropies is not None:
            on_entropies(entropies, mask)
        return weights(forward["logp"], entropies) if callable(weights) else weights

    def capture(original: Callable) -> Callable:
        def call(*args, **kwargs):
            out = original(*args, **kwargs)
            forward.setdefault("logp", out[0])  # the policy forward is _compute_loss's first
            return out

        return call

    quantile = trainer.top_entropy_quantile
    trainer.top_entropy_quantile = 0.0
    try:
        with _replaced(trainer, "get_high_entropy_mask", lambda _: slot):
            if callable(weights):
                with _replaced(trainer, "_get_per_token_logps_and_entropies", capture):
                    yield
            else:
                yield
    finally:
        trainer.top_entropy_quantile = quantile


def weighted_trl_loss(
    trainer: GRPOTrainer,
    model,
    inputs: dict,
    weights: Weights,
    on_entropies: Callable[[Tensor, Tensor], None] | None = None,
) -> Tensor:
    """TRL's `_compute_loss` on `inputs` with `weights` [B, T] multiplying its per-token loss."""
    with weight_slot(trainer, weights, on_entropies):
        return GRPOTrainer._compute_loss(trainer, model, inputs)


@contextmanager
def loss_side_effects_undone(trainer: GRPOTrainer) -> Iterator[None]:
    """An extra loss call (gradient geometry) leaves no metric rows and no entropy-controller update behind
    (reaches 8, 10)."""
    rows_by_mode = trainer._metrics
    lengths = {mode: {k: len(v) for k, v in rows.items()} for mode, rows in rows_by_mode.items()}
    controller = (trainer.entropy_coef, trainer._last_world_entropy, trainer._entropy_window_stats)
    try:
        yield
    finally:
        for mode, rows in rows_by_mode.items():
            for k in list(rows):
                if k not in lengths[mode]:
                    del rows[k]
                else:
                    del rows[k][lengths[mode][k] :]
        trainer.entropy_coef, trainer._last_world_entropy, trainer._entropy_window_stats = controller


# ---- 4, 5, 6, 7: where a generation batch's statistics come from -----------------------------------
def makes_old_logp_forward(trainer: GRPOTrainer) -> bool:
    """TRL's own condition (reach 6) for its no-grad old-log-prob forward in `_generate_and_score_completions`."""
    a: Any = trainer.args  # a GRPOConfig (typed TrainingArguments by transformers)
    generate_every = a.steps_per_generation * trainer.num_iterations
    return a.gradient_accumulation_steps % generate_every != 0 or bool(
        trainer.use_vllm and trainer.vllm_importance_sampling_correction
    )


def generates_with_transformers(trainer: GRPOTrainer) -> bool:
    """True when TRL samples with transformers' `generate` in `_generate_single_turn` (reach 7): no vLLM, no
    continuous batching, no rollout_func, no tools."""
    return not (
        trainer.use_vllm
        or getattr(trainer, "use_transformers_continuous_batching", False)
        or getattr(trainer, "rollout_func", None) is not None
        or getattr(trainer, "tools", None)
    )


def around_generation(trainer: GRPOTrainer, around: Callable[[], AbstractContextManager]) -> AbstractContextManager:
    """Inside the block, each of TRL's `_generate_single_turn` calls runs inside `around()` (reach 5)."""

    def wrap(generate: Callable) -> Callable:
        def call(*args, **kwargs):
            with around():
                return generate(*args, **kwargs)

        return call

    return _replaced(trainer, "_generate_single_turn", wrap)


# answer(input_ids, attention_mask, logits_to_keep, forward_kwargs) -> logp [B, T] of TRL's old-log-prob call
OldLogpAnswer = Callable[[Tensor, Tensor, int, dict], Tensor]


def old_logp_forward_answered(trainer: GRPOTrainer, answer: OldLogpAnswer) -> AbstractContextManager:
    """Inside the block, TRL's first no-grad old-log-prob forward of the policy (reach 4 in
    `_generate_and_score_completions`) is answered by `answer`, whose log-probs TRL keeps as
    `old_per_token_logps`; every other call of `_get_per_token_logps_and_entropies` runs TRL's own."""
    answered = {"done": False}

    def wrap(forward: Callable) -> Callable:
        def call(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            if answered["done"] or model is not trainer.model or torch.is_grad_enabled():
                return forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            answered["done"] = True
            return answer(input_ids, attention_mask, logits_to_keep, kwargs), None, None

        return call

    return _replaced(trainer, "_get_per_token_logps_and_entropies", wrap)


# ---- 8, 9: TRL's metric rows and micro-batch counter ---------------------------------------------
def metric_rows(trainer: GRPOTrainer, mode: str) -> dict[str, list]:
    """TRL's per-mode metric rows (reach 8): TRL averages each list into the next logged step."""
    return trainer._metrics[mode]


def micro_batches_done(trainer: GRPOTrainer) -> int:
    """TRL's count of micro-batches trained so far (reach 9: advanced after each loss)."""
    return int(trainer._step)


# ---- 11: the vLLM engine TRL builds ------------------------------------------------------------------
def install_engine_factory(factory: Callable) -> None:
    """TRL's colocated engine is built by `factory` (reach 11: the `LLM` name TRL's module calls)."""
    import trl.generation.vllm_generation as trl_vllm  # deferred: TRL's vLLM module, only when vLLM generates

    trl_vllm.LLM = factory
