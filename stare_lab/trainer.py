"""TokenRuleGRPOTrainer: TRL's GRPOTrainer with per-token weights from a token rule.

Glue on TRL's two extension points:
- `_generate_and_score_completions`: the parent generates, scores and computes advantages; the
  statistics the rule declares come from the cheapest exact source (`signals/paths.py`: recorded
  during transformers generation, TRL's own old-log-prob forward, or one no-grad pass,
  `signals.token_statistics`), are gathered over ranks (`distributed.global_token_stats`), the rule
  is called once on the global batch with the trainer's values in its state, and this rank's rows of
  `token_weights` [B, T] (plus the global weight sum, a 0-dim tensor) are attached to the batch.
  TRL shuffles and splits them with the rest, so weights never depend on the micro-batch split.
- `_compute_loss`: TRL's own `GRPOTrainer._compute_loss` with the weights in its per-token mask
  slot (`trl_loss.py`; every TRL loss variant composes, docs/trl_parity.md). With rule `full`
  this is TRL's loss to the bit (a test). `scope: microbatch` rules choose their weights inside
  that call from the training forward's own statistics (`methods/microbatch.py`).
Besides these, `_save_checkpoint` writes the rule state into each checkpoint before transformers
marks it complete, so a resumed run continues the rule's memory.
The trainer never names a rule: it asks the registry (`stare_lab.methods`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from stare_lab import distributed
from stare_lab.methods import Rule, RuleState, TrainerValues
from stare_lab.methods.microbatch import check_microbatch_scope, defer_to_loss, microbatch_weights
from stare_lab.record import RULE_STATE_FILE
from stare_lab.signals import token_statistics
from stare_lab.signals.attention import CHUNK_QUERIES
from stare_lab.signals.generation import record_generation
from stare_lab.signals.js import CHUNK_POSITIONS
from stare_lab.signals.paths import generation_needs, ride_old_logp_forward, stats_path
from stare_lab.signals.vocab import CHUNK_TOKENS
from stare_lab.stats import TokenStats
from stare_lab.utils import atomic_write_json

NORMALIZE_CODES = ("valid", "selected", "loss_type")


class TokenRuleGRPOTrainer(GRPOTrainer):
    def __init__(
        self,
        *args,
        rule: Rule,
        rule_state: RuleState | None = None,
        grad_geometry_every: int = 0,
        stats_chunk_tokens: int = CHUNK_TOKENS,
        attn_chunk_queries: int = CHUNK_QUERIES,
        js_chunk_positions: int = CHUNK_POSITIONS,
        keep_batches_every: int = 0,
        run_dir: str | Path | None = None,
        stats_at_generation: bool = True,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        _check_supported(self)
        self.rule = rule
        # the values this trainer uses (TRL resolved epsilon_high=None to epsilon): rules read these
        self.trainer_values = TrainerValues(
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            loss_type=self.loss_type,
            num_generations=self.num_generations,
        )
        rule.check_trainer(self.trainer_values)
        self.rule_state = rule_state or RuleState(seed=self.args.seed)
        self.rule_state.trainer = self.trainer_values
        self.grad_geometry_every = grad_geometry_every
        self.stats_chunk_tokens = stats_chunk_tokens
        self.attn_chunk_queries = attn_chunk_queries
        self.js_chunk_positions = js_chunk_positions
        if keep_batches_every > 0 and run_dir is None:
            raise ValueError("keep_batches_every > 0 needs run_dir: kept batches go to <run_dir>/batches")
        self.keep_batches_every = keep_batches_every  # viewer: keep every N-th generation batch (0 = never)
        self.run_dir = run_dir
        self.stats_at_generation = stats_at_generation  # record statistics while transformers generates
        self.microbatch = check_microbatch_scope(rule, self.trainer_values)
        self._taken: dict[str, torch.Tensor] | None = None  # statistics from generation or the old-log-prob forward
        self._ride_armed = False
        self._record = None
        self._loss_inputs = None

    # ---- generation time: statistics and weights -------------------------------------------
    def _generate_and_score_completions(self, inputs):
        self._taken, path = None, self.stats_path()
        self._ride_armed = path == "old_logp_forward"
        try:
            out = super()._generate_and_score_completions(inputs)
        finally:
            self._ride_armed, record, self._record = False, self._record, None
        if record is not None:  # None when the recording does not line up: the pass computes everything
            self._taken = record.result(out["completion_ids"], out["completion_mask"])
        mode = "train" if self.model.training else "eval"
        if self.microbatch:
            return defer_to_loss(self, out)
        local, rollout_entropy = self._token_stats(out, given=self._taken)
        self._taken = None
        # the rule sees the global generation batch, identical on every rank (docs/distributed.md §4);
        # with one process `stats is local` and `local_rows` is the identity
        stats, rows = distributed.global_token_stats(local, self.accelerator)
        self.rule_state.step = self.state.global_step
        self.rule_state.total_steps = max(self.state.max_steps, 1)
        self.rule_state.trainer = self.trainer_values
        every = self.keep_batches_every
        keep = mode == "train" and every > 0 and self.state.global_step % every == 0  # viewer.keep_due
        state_before = self.rule_state.to_dict() if keep else None  # the rule updates its memory in place
        with distributed.deterministic():
            result = self.rule(stats, self.rule_state)
        weights = result.weights.to(out["completion_mask"].device)
        out["token_weights"] = distributed.local_rows(weights, rows)
        out["token_weight_total"] = weights.sum()  # global already: every rank's rows are in `weights`
        out["token_normalize"] = torch.tensor(NORMALIZE_CODES.index(result.normalize))
        selected = (result.selected if result.selected is not None else stats.valid) & stats.valid
        out["token_selected"] = distributed.local_rows(selected, rows).float()
        if keep:
            from stare_lab.viewer.collect import collect_for_trainer

            collect_for_trainer(
                self,
                out,
                stats,
                run_dir=self.run_dir,
                every=self.keep_batches_every,
                rule_state=state_before,
                trained_weights=weights,
            )
        entropy_mean = self._global_mean(rollout_entropy, local.mask) if rollout_entropy is not None else None
        self._log_rule_metrics(mode, stats, weights, selected.float(), result.metrics, entropy_mean)
        return out

    def _global_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        """Mean of x over the valid tokens of every rank."""
        totals = torch.stack([(x * mask).sum(), mask.sum().float()])
        totals = self.accelerator.reduce(totals, reduction="sum") if self.accelerator.num_processes > 1 else totals
        return (totals[0] / totals[1].clamp(min=1)).item()

    @torch.no_grad()
    def _token_stats(self, out, given=None) -> tuple[TokenStats, torch.Tensor | None]:
        """TokenStats with what the rule declares, and the rollout entropy if computed. `given`: statistics
        recorded during generation or taken from TRL's old-log-prob forward; the pass computes the rest."""
        completion_ids, mask = out["completion_ids"], out["completion_mask"]
        B, T = completion_ids.shape
        needs = self.rule.needs_for(self.trainer_values)
        group = self._global_group(B, mask.device)
        computed = self._statistics(out, needs, group, given)
        declared = {k: v for k, v in computed.items() if k in needs}
        # logp is a required field: NaN where the rule did not declare it, so reading it anyway shows
        logp = declared.pop("logp", torch.full((B, T), float("nan"), device=mask.device))
        stats = TokenStats(logp=logp, mask=mask, advantages=out["advantages"], group=group, **declared)
        return stats, computed.get("entropy")

    def _global_group(self, B: int, device) -> torch.Tensor:
        """[B] global prompt index of this rank's rows ((process_index·B + row) // G)."""
        return (self.accelerator.process_index * B + torch.arange(B, device=device)) // self.num_generations

    def _statistics(self, batch, needs, group, given=None) -> dict[str, torch.Tensor]:
        G = self.num_generations
        return token_statistics(
            self.accelerator.unwrap_model(self.model),
            batch,
            needs,
            num_generations=G,
            temperature=self.temperature,
            attn_layers=self.rule.attn_layers,
            rows_per_forward=max(G, (self.args.per_device_train_batch_size // G) * G),
            chunk_tokens=self.stats_chunk_tokens,
            chunk_queries=self.attn_chunk_queries,
            chunk_positions=self.js_chunk_positions,
            group=group,
            accelerator=self.accelerator,
            given=given,
        )

    # ---- where the statistics come from (docs/pitfalls_signals.md, "Statistics paths") ------------
    def stats_path(self) -> str:
        """How this generation batch's statistics are obtained: "none" (the rule reads only TRL's batch),
        "microbatch" (inside the loss), "old_logp_forward" (TRL's own no-grad forward of the rollout
        policy, when it makes one), "generation" (recorded while transformers generates; JS still takes
        the pass), or "pass" (one no-grad forward after generation)."""
        return stats_path(self)

    def _generate_single_turn(self, *args, **kwargs):
        if self.stats_path() != "generation":
            return super()._generate_single_turn(*args, **kwargs)
        # JS at generation time only in one process: the pass's JS of groups split over ranks is a collective
        one_process = self.accelerator.num_processes == 1
        with record_generation(
            self.model,
            generation_needs(self),
            temperature=self.temperature,
            attn_layers=self.rule.attn_layers,
            chunk_queries=self.attn_chunk_queries,
            js_group=self.num_generations if one_process else None,
            eos_ids=self.eos_token_ids,
        ) as rec:
            result = super()._generate_single_turn(*args, **kwargs)
        self._record = rec
        return result

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if self._ride_armed and model is self.model and not torch.is_grad_enabled():
            # TRL's old-log-prob forward of the rollout policy: the rule's statistics come out of it
            self._ride_armed = False
            return ride_old_logp_forward(self, input_ids, attention_mask, logits_to_keep, kwargs)
        logp, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        if self._loss_inputs is not None and entropies is not None:  # scope "microbatch": select from this forward
            inputs, self._loss_inputs = self._loss_inputs, None
            self._microbatch_weights(inputs, entropies, logp)
        return logp, entropies, aux

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # scope "microbatch": the first forward inside _compute_loss sets this micro-batch's weights
        self._loss_inputs = inputs if self.microbatch else None
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if self._loss_inputs is not None:
                raise RuntimeError(
                    "scope 'microbatch': _compute_loss made no forward with entropies, so no weights "
                    "were selected for this micro-batch"
                )
            return loss
        finally:
            self._loss_inputs = None

    def _microbatch_weights(self, inputs, entropies, logp) -> None:
        """Scope "microbatch": the rule on this micro-batch (of every rank) from the training forward's own
        detached statistics of the current policy; writes token_weights/selected/normalize/weight_total
        into `inputs`. Called by the first `_get_per_token_logps_and_entropies` inside `_compute_loss`."""
        microbatch_weights(self, inputs, entropies, logp)

    def _log_rule_metrics(self, mode, stats, weights, selected, rule_metrics, rollout_entropy) -> None:
        """Global values (the rule's batch), the same on every rank; rollout_entropy: its global mean or None."""
        valid = stats.mask
        n = valid.sum().clamp(min=1)
        w = weights[valid > 0]
        m = self._metrics[mode]
        m["tokens/selected_frac"].append((selected.sum() / n).item())
        m["tokens/weight_mean"].append(w.mean().item() if w.numel() else 0.0)
        m["tokens/weight_std"].append(w.std().item() if w.numel() > 1 else 0.0)
        if rollout_entropy is not None:
            m["tokens/rollout_entropy"].append(rollout_entropy)
        for k, v in rule_metrics.items():
            m[k].append(float(v))

    # ---- loss -------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        """TRL's own loss with the rule's weights in its per-token mask slot (trl_loss.py, docs/trl_parity.md)."""
        from stare_lab import trl_loss

        mode = "train" if self.model.training else "eval"
        seen = {}

        def weights():  # read when TRL reaches the slot: a "microbatch" rule has just written them
            return trl_loss.loss_weights(self, inputs, NORMALIZE_CODES[int(inputs["token_normalize"])])

        loss = trl_loss.trl_loss(
            self,
            model,
            inputs,
            weights,
            on_entropies=lambda entropies, mask: seen.update(entropies=entropies.detach(), mask=mask),
        )
        if mode == "train" and self._geometry_due():
            self._log_gradient_geometry(model, inputs, loss)
        self._log_loss_metrics(mode, seen["entropies"], seen["mask"], inputs)
        return loss

    def _geometry_due(self) -> bool:
        n = self.grad_geometry_every
        first_micro_batch = self._step % self.current_gradient_accumulation_steps == 0
        return n > 0 and first_micro_batch and self.state.global_step % n == 0

    def _log_gradient_geometry(self, model, inputs, loss) -> None:
        """Cosine and norm ratio of the weighted gradient against the full-token gradient on this micro-batch
        (TRL's loss a second time with the completion mask in the slot; its side effects undone)."""
        from stare_lab import trl_loss

        cosine, norm_ratio = trl_loss.gradient_geometry(self, model, inputs, loss)
        self._metrics["train"]["geometry/cosine"].append(cosine)
        self._metrics["train"]["geometry/norm_ratio"].append(norm_ratio)

    def _log_loss_metrics(self, mode, entropies, mask, inputs) -> None:
        """TRL logs entropy, clip ratios, KL, aux loss; ours: the entropy of the rule's selected tokens."""
        selected = inputs["token_selected"] * mask
        totals = self.accelerator.reduce(
            torch.stack([(entropies * selected).sum(), selected.sum().float()]), reduction="sum"
        )
        self._metrics[mode]["tokens/entropy_selected"].append((totals[0] / totals[1].clamp(min=1.0)).item())

    # ---- rule state in checkpoints ----------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        """Write rule_state.json into the checkpoint folder first, then let TRL/transformers save.

        A checkpoint counts as complete once transformers has written trainer_state.json, near the
        end of `Trainer._save_checkpoint` (transformers 5.24); a callback's `on_save` runs only
        after that, so a crash in between left a "complete" checkpoint without rule state.
        """
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            atomic_write_json(folder / RULE_STATE_FILE, self.rule_state.to_dict())
        super()._save_checkpoint(model, trial)

    def load_rule_state(self, checkpoint_dir: str | Path) -> None:
        """Continue the rule state saved in `checkpoint_dir`; a checkpoint without one is refused."""
        path = Path(checkpoint_dir) / RULE_STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"checkpoint {checkpoint_dir} has no {RULE_STATE_FILE}: its rule state was never "
                f"saved, so resuming from it would restart the rule's memory"
            )
        self.rule_state = RuleState.from_dict(json.loads(path.read_text()))
        self.rule_state.trainer = self.trainer_values


def _check_supported(t: GRPOTrainer) -> None:
    """Refuse the TRL features that do not compose with token weights, each with its reason (docs/trl_parity.md)."""
    from stare_lab import trl_loss

    problems = trl_loss.refusals(t)
    if problems:
        raise ValueError(f"TokenRuleGRPOTrainer does not support {'; '.join(problems)}")
