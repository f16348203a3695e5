"""TokenRuleGRPOTrainer: TRL's GRPOTrainer with per-token weights from a token rule.

Glue on TRL's extension points; the class docstring lists each method it overrides and why. One step
reads top-down: `generation_batch` (generate → statistics → rule → metrics) and `micro_batch_loss`
(TRL's loss with the weights → a loss-changing rule's terms → metrics). The statistics
the rule declares come from the cheapest exact source (`signals/sources.py`), the rule runs through
`token_weights.apply_rule`, and the loss is `objective.trainer_loss`: TRL's own `_compute_loss` with
the weights in its per-token mask slot (docs/trl_parity.md). Every reach into TRL's private code (the
slot, the armed generation and old-log-prob calls, TRL's metric rows and micro-batch counter) goes
through `stare_lab/training/trl_internals.py`, which lists them. With rule `full`
this is TRL's loss to the bit (a test). The trainer never names a rule: it asks the registry
(`stare_lab.methods`).
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch

from stare_lab.core.utils import atomic_write_json
from stare_lab.methods import NORMALIZE, LossBatch, Rule, RuleState, TrainerValues
from stare_lab.methods.loss_types import AGGREGATIONS, RANKS
from stare_lab.methods.ppo import replaces_surrogate
from stare_lab.methods.select import check_choice
from stare_lab.record import RULE_STATE_FILE
from stare_lab.record.kept_batch import batch_path, save_batch
from stare_lab.signals import distributed, sources, token_statistics
from stare_lab.signals.attention import CHUNK_QUERIES
from stare_lab.signals.generation import record_generation
from stare_lab.signals.js import CHUNK_POSITIONS
from stare_lab.signals.vocab import CHUNK_TOKENS
from stare_lab.stats import TokenStats
from stare_lab.training import objective, trl_internals, trl_loss
from stare_lab.training.kept_batches import KEPT_ROW, LossRecord, kept_batch_fields
from stare_lab.training.token_weights import (
    apply_rule,
    deferred_inputs,
    microbatch_stats,
    microbatch_total_scale,
    per_token_scope,
    selects_in_loss,
    token_fractions,
)


class TokenRuleGRPOTrainer(trl_internals.GRPOSteps):
    """TRL 1.16's GRPOTrainer with a token rule's weights in the loss.

    The steps it defines (`trl_internals.GRPOSteps` maps TRL's private methods onto them, because TRL
    offers no hook there):
    - `generation_batch` (TRL's `_generate_and_score_completions`): after TRL generates, scores and
      computes advantages, the rule's statistics (`_token_stats`) and weights (`token_weights.apply_rule`)
      join the batch dict TRL returns, which TRL shuffles and splits with the rest (so weights never depend
      on the micro-batch split). For TRL's one call it arms, when the statistics come from there, TRL's
      `_generate_single_turn` (recording during transformers generation) or its no-grad old-log-prob
      forward (the statistics pass is that forward): `_statistics_armed`, through `trl_internals`, the values
      returned in a local dict.
    - `micro_batch_loss` (TRL's `_compute_loss`): `objective.trainer_loss`, TRL's own loss with the weights
      in its per-token mask slot; a rule of scope "microbatch" or "token" chooses its weights in that slot
      from the training forward (`_in_loss_slot`, which TRL calls; what it chose comes back in a local dict
      and joins the micro-batch's inputs after the loss); a rule that changes the loss
      (`Rule.changes_loss`) adds its terms (`trl_loss.surrogate_change`: its policy term in place of TRL's
      clipped surrogate).
    - `log` (public): every train-step log names the step that generated its batch (`generation_step`), and
      a step that trained on an earlier step's batch carries that generation's metrics (TRL logs rewards
      and completion lengths only where it generated), so metrics.jsonl has one complete row per step.
    - `before_checkpoint` (transformers' `_save_checkpoint`): the rule state goes into each checkpoint
      before transformers marks it complete (a callback's `on_save` runs only after that), so a resumed
      run continues it.
    """

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
        microbatch_aggregation: str = "verl",
        microbatch_ranks: str = "process",
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
            num_iterations=self.num_iterations,
            delta=self.args.delta,
            importance_sampling_level=self.importance_sampling_level,
        )
        rule.check_trainer(self.trainer_values)
        if rule.changes_loss:  # what trl_loss.surrogate_change needs, for a rule whose `check` leaves it out
            try:
                replaces_surrogate(self.trainer_values)
            except ValueError as e:
                raise ValueError(f"rule {rule.name!r}: {e}") from None
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
        self.selects_in_loss = selects_in_loss(rule, self.trainer_values)  # scope "microbatch" or "token"
        if rule.iterations > 1 and not self.selects_in_loss:
            raise ValueError(
                f"rule {rule.name!r} has weights per iteration ({rule.iterations}); it must run in the loss "
                "(scope 'token' or 'microbatch')"
            )
        # scope "microbatch" (training/token_weights.py): verl's token-mean per micro-batch or TRL's aggregation;
        # selection per process (the official codes) or over the micro-batches of every rank
        self.microbatch_aggregation = check_choice("microbatch_aggregation", microbatch_aggregation, AGGREGATIONS)
        self.microbatch_ranks = check_choice("microbatch_ranks", microbatch_ranks, RANKS)
        self._loss_record: LossRecord | None = None  # the loss's record of the kept batch being trained on, if any
        self._microbatch_metrics: dict[str, float] = {}  # the rule's metrics of the last micro-batch (scope microbatch)
        # the last generation's metrics, carried to the steps that train on its batch without generating (`log`)
        self._generation_values: dict[str, float] = {}
        self._generation_step: int | None = None
        self._generated_since_log = False

    @property
    def batch_needs(self) -> frozenset[str]:
        """What the statistics sources compute per generation batch: the rule's needs, or for scope
        "microbatch" only what it reads once per step (`step_needs`)."""
        values = self.trainer_values
        return self.rule.step_needs_for(values) if self.selects_in_loss else self.rule.needs_for(values)

    # ---- one generation batch: generate → statistics → rule → metrics ----------------------------
    def generation_batch(self, inputs: list[dict]) -> dict:
        """TRL generates, scores and computes advantages (with the statistics source armed on its one call);
        then the rule's statistics, the rule, and its metrics; the weights join the batch dict TRL returns,
        which TRL shuffles and splits with the rest (so weights never depend on the micro-batch split)."""
        training = self.model.training
        before = {k: (id(v), len(v)) for k, v in self._metric_rows("train").items()} if training else None
        from_trl: dict = {}  # what the armed source got from TRL's call: "record" or "stats"
        with self._statistics_armed(self.stats_source(), from_trl):
            out = self.trl_generation_batch(inputs)
        given = self._given_statistics(from_trl, out)
        self._step_into_rule_state()
        if self.selects_in_loss:
            self._defer_rule_to_loss(out, given)
        else:
            self._apply_rule_at_generation(out, given)
        if before is not None:
            self._remember_generation(before)
        return out

    def _given_statistics(self, from_trl: dict, out: dict) -> dict[str, torch.Tensor] | None:
        """The statistics the armed source took: the generation recording aligned with TRL's completions (None
        when it does not line up: the pass computes everything), or TRL's old-log-prob forward's."""
        record = from_trl.get("record")
        if record is not None:
            return record.result(out["completion_ids"], out["completion_mask"])
        return from_trl.get("stats")

    def _step_into_rule_state(self) -> None:
        """The rule state gets the step (the rule's seeded draws and schedules move) and the trainer's values."""
        self.rule_state.step = self.state.global_step
        self.rule_state.total_steps = max(self.state.max_steps, 1)
        self.rule_state.trainer = self.trainer_values

    def _keep_due(self) -> bool:
        every = self.keep_batches_every
        return self.model.training and every > 0 and self.state.global_step % every == 0  # viewer.keep_due

    def _apply_rule_at_generation(self, out: dict, given: dict | None) -> None:
        """Scope batch, group or sequence: the rule on the global generation batch, identical on every rank
        (docs/distributed.md §4); its loss inputs join `out`."""
        keep = self._keep_due()
        local, rollout_entropy = self._token_stats(out, given=given)
        state_before = self.rule_state.to_dict() if keep else None  # the rule updates its memory in place
        applied = apply_rule(self.rule, self.rule_state, local, self.accelerator)
        out.update(applied.inputs)
        if state_before is not None:
            self._keep_batch(out, applied.stats, state_before, applied.weights)
        entropy_mean = self._global_mean(rollout_entropy, local.mask) if rollout_entropy is not None else None
        self._log_rule_metrics("train" if self.model.training else "eval", applied, entropy_mean)

    def _defer_rule_to_loss(self, out: dict, given: dict | None) -> None:
        """Scope "microbatch" or "token": the rule runs per micro-batch in the loss; here only what it reads
        once per step (`step_stats`), and NaN stand-ins of its loss inputs (`deferred_inputs`)."""
        self.rule_state.step_stats = None
        if self.batch_needs:
            local, _ = self._token_stats(out, given=given)
            self.rule_state.step_stats = distributed.global_token_stats(local, self.accelerator)[0]
        out.update(deferred_inputs(out["completion_mask"]))
        if self._keep_due():  # the generation batch now, what the rule does with it in the loss (LossRecord)
            self._keep_batch(out, self.rule_state.step_stats, self.rule_state.to_dict(), None)

    def _remember_generation(self, before: dict) -> None:
        """The metrics this generation logged (TRL's rewards, completion lengths, token counts; a batch-scope
        rule's metrics): kept to be carried to the steps that train on the batch without generating (`log`)."""
        m = self._metric_rows("train")
        logged = [k for k, v in m.items() if v and before.get(k) != (id(v), len(v))]
        self._generation_values = {k: m[k][-1] for k in logged}
        self._generation_step = self.state.global_step + 1  # the optimizer step whose first micro-batch generated
        self._generated_since_log = True

    def log(self, logs: dict, start_time: float | None = None) -> None:
        """Every train-step log holds `generation_step`, the optimizer step that generated the batch it
        trained on; a step that did not generate (steps_per_generation > gradient_accumulation_steps,
        num_iterations > 1) carries that generation's metrics (reward, reward_std, completions/*, rewards/*,
        a batch-scope rule's tokens/* and rule/*), so every optimizer step is a complete row of the record.
        TRL logs them only where it generated; its own averaging turns the one carried value into itself."""
        if self.model.training and "loss" in logs and self._generation_step is not None:
            if not self._generated_since_log:
                rows = self._metric_rows("train")
                for k, v in self._generation_values.items():
                    rows[k] = [v]
            logs["generation_step"] = self._generation_step
            self._generated_since_log = False
        super().log(logs, start_time)

    def _metric_rows(self, mode: str) -> dict[str, list]:
        return trl_internals.metric_rows(self, mode)

    def _keep_batch(
        self, out: dict, stats: TokenStats | None, state_before: dict, weights: torch.Tensor | None
    ) -> None:
        """Keep this generation batch for the viewer (`trainer.keep_batches_every`): every statistic any rule
        reads, the rule state before the rule ran and, for a rule choosing its weights here, the weights it
        trained with. A rule that chooses its tokens in the loss or changes the loss gets the loss's record
        too (`viewer.collect.LossRecord`: the training forward's statistics, weights, selected and touched
        tokens of every micro-batch of every pass), filled by `micro_batch_loss`."""
        assert self.run_dir is not None, "__init__ refuses keep_batches_every > 0 without run_dir"
        step = self.state.global_step
        fields = kept_batch_fields(self, out, stats, rule_state=state_before, trained_weights=weights)
        path = batch_path(self.run_dir, step)
        if not (self.selects_in_loss or self.rule.changes_loss):
            if fields is not None:
                save_batch(path, step, **fields)
            return
        record = self._loss_record = LossRecord(self, fields, path, step, out)
        record.save()
        ids = out["completion_ids"]
        out[KEPT_ROW] = torch.arange(ids.size(0), device=ids.device)

    def _global_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        """Mean of x over the valid tokens of every rank."""
        totals = torch.stack([(x * mask).sum(), mask.sum().float()])
        totals = self.accelerator.reduce(totals, reduction="sum") if self.accelerator.num_processes > 1 else totals
        return (totals[0] / totals[1].clamp(min=1)).item()

    @torch.no_grad()
    def _token_stats(self, out, given=None) -> tuple[TokenStats, torch.Tensor | None]:
        """TokenStats with what the rule declares, and the rollout entropy if computed. `given`: statistics
        recorded during generation or computed in TRL's old-log-prob forward; the pass computes the rest."""
        completion_ids, mask = out["completion_ids"], out["completion_mask"]
        B, T = completion_ids.shape
        needs = self.batch_needs
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
        if given is not None and set(needs) <= set(given):  # all recorded: token_statistics would return them
            return dict(given)
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

    # ---- where the statistics come from (docs/pitfalls_signals.md, "Statistics sources") ---------
    def stats_source(self) -> str:
        """How this generation batch's statistics are obtained: "none" (the rule reads only TRL's batch),
        "microbatch" (inside the loss, and nothing read once per step), "old_logp_forward" (TRL's own
        no-grad forward of the rollout policy, when it makes one), "generation" (recorded while
        transformers generates; JS still takes the pass), or "pass" (one no-grad forward after generation)."""
        return sources.stats_source(
            self.batch_needs,
            selects_in_loss=self.selects_in_loss,
            old_logp_forward=trl_internals.makes_old_logp_forward(self),
            transformers_generates=trl_internals.generates_with_transformers(self),
            at_generation=self.stats_at_generation,
        )

    def model_needs(self) -> frozenset[str]:
        """The statistics of the generation batch that need a forward of the rollout policy (`sources.model_needs`)."""
        return sources.model_needs(self.batch_needs, trl_internals.makes_old_logp_forward(self))

    def _statistics_armed(self, source: str, from_trl: dict) -> AbstractContextManager:
        """For TRL's one generation call (`trl_generation_batch`), arm the TRL call the statistics come
        from (trl_internals): `from_trl` holds afterwards "record" (the generation recording) or "stats" (computed
        in TRL's old-log-prob forward), or nothing."""
        if source == "generation":
            return trl_internals.around_generation(self, lambda: self._recording(from_trl))
        if source == "old_logp_forward":

            def answer(input_ids, attention_mask, logits_to_keep, forward_kwargs):
                # TRL's old-log-prob forward of the rollout policy: the rule's statistics come out of it
                from_trl["stats"] = sources.statistics_from_old_logp_forward(
                    self._rows_statistics, self.model_needs(), input_ids, attention_mask, logits_to_keep, forward_kwargs
                )
                return from_trl["stats"]["logp"]

            return trl_internals.old_logp_forward_answered(self, answer)
        return nullcontext()

    @contextmanager
    def _recording(self, from_trl: dict):
        """One transformers generate call recorded (signals/generation.py); JS at generation time only in one
        process: the pass's JS of groups split over ranks is a collective."""
        one_process = self.accelerator.num_processes == 1
        needs = sources.generation_needs(self.batch_needs, trl_internals.makes_old_logp_forward(self))
        with record_generation(
            self.model,
            needs,
            temperature=self.temperature,
            attn_layers=self.rule.attn_layers,
            chunk_queries=self.attn_chunk_queries,
            js_group=self.num_generations if one_process else None,
            eos_ids=self.eos_token_ids,
        ) as rec:
            yield
        from_trl["record"] = rec

    def _rows_statistics(self, batch: dict, needs: frozenset[str]) -> dict[str, torch.Tensor]:
        """The statistics pass over `batch`, whose rows are this rank's rows of the generation batch."""
        ids = batch["completion_ids"]
        return self._statistics(batch, needs, self._global_group(ids.size(0), ids.device))

    def _microbatch_weights(self, inputs: dict, entropies: torch.Tensor, logp: torch.Tensor) -> dict:
        """Scope "microbatch": the rule on this process's micro-batch (every rank's with microbatch_ranks
        "gathered") from the training forward's own detached statistics of the current policy; returns
        its loss inputs (token_weights.apply_rule)."""
        needs = self.rule.needs_for(self.trainer_values)
        local = microbatch_stats(needs, inputs, entropies, logp, self.accelerator.process_index)
        training = self.model.training
        self.rule_state.iteration = self._iteration()
        applied = apply_rule(
            self.rule,
            self.rule_state,
            local,
            self.accelerator,
            gather=self.microbatch_ranks == "gathered" and not per_token_scope(self.rule),
            total_scale=microbatch_total_scale(
                self.microbatch_ranks, self.accelerator.num_processes, self.steps_per_generation if training else 1
            ),
        )
        self._log_rule_metrics("train" if training else "eval", applied, None)
        self._microbatch_metrics = applied.metrics
        return applied.inputs

    def _log_rule_metrics(self, mode, applied, rollout_entropy) -> None:
        """Global values (the rule's batch), the same on every rank; rollout_entropy: its global mean or None."""
        valid = applied.stats.mask
        n = valid.sum().clamp(min=1)
        w = applied.weights[valid > 0]
        m = self._metric_rows(mode)
        m["tokens/selected_frac"].append((applied.selected.float().sum() / n).item())
        m["tokens/weight_mean"].append(w.mean().item() if w.numel() else 0.0)
        m["tokens/weight_std"].append(w.std().item() if w.numel() > 1 else 0.0)
        if rollout_entropy is not None:
            m["tokens/rollout_entropy"].append(rollout_entropy)
        for k, v in applied.metrics.items():
            m[k].append(float(v))

    def _iteration(self) -> int:
        """Which of TRL's `num_iterations` passes over the buffered generation batch this micro-batch is
        in (TRL's `_prepare_inputs` reuses a batch for steps_per_generation × num_iterations micro-batches;
        `trl_internals.micro_batches_done` counts micro-batches, advanced after the loss); 0 in evaluation."""
        if not self.model.training:
            return 0
        return (trl_internals.micro_batches_done(self) // self.steps_per_generation) % self.num_iterations

    # ---- loss -------------------------------------------------------------------------------
    def micro_batch_loss(self, model: torch.nn.Module, inputs: dict) -> torch.Tensor:
        """One micro-batch's loss: TRL's own loss with the rule's weights in its per-token mask slot
        (objective.trainer_loss), the terms of a rule that changes the loss added (trl_loss.surrogate_change),
        then the metrics. A rule that runs in the loss, or changes it, chooses in TRL's slot, right after TRL's
        forward (`_in_loss_slot`): TRL calls it, and what it chose comes back in `chosen`."""
        mode = "train" if self.model.training else "eval"
        seen: dict = {}  # the training forward's entropies and mask, for the metrics
        chosen: dict = {}  # what the slot chose: loss inputs, forward, loss terms
        in_loss = self.selects_in_loss or self.rule.changes_loss
        loss = objective.trainer_loss(
            self,
            model,
            inputs,
            (lambda logp, entropies: self._in_loss_slot(inputs, logp, entropies, chosen)) if in_loss else None,
            on_entropies=lambda entropies, mask: seen.update(entropies=entropies.detach(), mask=mask),
        )
        inputs.update(chosen.get("inputs", {}))  # the micro-batch's weights join its batch, as generation's do
        terms = chosen.get("terms")
        if terms is not None:
            loss = loss + trl_loss.trl_aggregate(self, chosen["change"], inputs) + trl_loss.own_term(self, terms)
            self._log_loss_terms(mode, terms.metrics)
        if mode == "train" and self._geometry_due():
            self._log_gradient_geometry(model, inputs, loss)
        touched = terms.touched if terms is not None else {}
        self._log_loss_metrics(mode, seen["entropies"], seen["mask"], inputs, touched)
        if self._loss_record is not None and mode == "train" and "forward" in chosen:
            self._record_loss(inputs, chosen["forward"], touched, terms.metrics if terms is not None else {})
        return loss

    def _in_loss_slot(self, inputs: dict, logp: torch.Tensor, entropies: torch.Tensor, chosen: dict) -> torch.Tensor:
        """TRL's slot, right after its forward: this micro-batch's weights [B, T] (scope "microbatch" or
        "token": the rule on the forward's statistics) and a loss-changing rule's terms, into `chosen`."""
        chosen["forward"] = {"logp": logp.detach(), "entropy": entropies.detach()}
        batch, aggregation = inputs, "trl"
        if self.selects_in_loss:
            chosen["inputs"] = self._microbatch_weights(inputs, entropies, logp)
            batch = {**inputs, **chosen["inputs"]}
            aggregation = "trl" if per_token_scope(self.rule) else self.microbatch_aggregation
        slot = trl_loss.loss_weights(self, batch, NORMALIZE[int(batch["token_normalize"])], aggregation)
        if self.rule.changes_loss:
            terms = self.rule.loss_terms(self._loss_batch(batch, logp, entropies))
            chosen.update(terms=terms, change=trl_loss.surrogate_change(self, batch, logp, slot, terms))
        return slot

    def _record_loss(self, inputs: dict, forward: dict, touched: dict, loss_metrics: dict) -> None:
        """This micro-batch into the kept batch's loss record, when it is one of that batch's rows."""
        record = self._loss_record
        if record is None or KEPT_ROW not in inputs:
            return
        metrics = {**(self._microbatch_metrics if self.selects_in_loss else {}), **loss_metrics}
        record.add(inputs, forward["logp"], forward["entropy"], touched, metrics, self.state.global_step + 1)
        if record.done:
            self._loss_record = None

    def _loss_batch(self, inputs: dict, logp: torch.Tensor, entropies: torch.Tensor) -> LossBatch:
        """What a loss-changing rule sees of this micro-batch: TRL's forward and TRL's batch."""
        old = inputs.get("old_per_token_logps")
        return LossBatch(
            logp=logp,
            old_logp=logp.detach() if old is None else old,
            advantages=inputs["advantages"],
            mask=trl_loss.loss_mask(inputs),
            entropy=entropies.detach(),
            selected=inputs["token_selected"] > 0,
            trainer=self.trainer_values,
            ref_logp=inputs.get("ref_per_token_logps"),
        )

    def _log_loss_terms(self, mode: str, metrics: dict[str, float]) -> None:
        """A loss-changing rule's per-micro-batch metrics, averaged over the ranks."""
        if not metrics:
            return
        keys = sorted(metrics)
        values = torch.tensor([float(metrics[k]) for k in keys], device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            values = self.accelerator.reduce(values, reduction="mean")
        for k, v in zip(keys, values.tolist(), strict=True):
            self._metric_rows(mode)[k].append(v)

    def _geometry_due(self) -> bool:
        n = self.grad_geometry_every
        first_micro_batch = trl_internals.micro_batches_done(self) % self.current_gradient_accumulation_steps == 0
        return n > 0 and first_micro_batch and self.state.global_step % n == 0

    def _log_gradient_geometry(self, model, inputs, loss) -> None:
        """Cosine and norm ratio of the weighted gradient against the full-token gradient on this micro-batch
        (TRL's loss a second time with the completion mask in the slot; its side effects undone)."""
        cosine, norm_ratio = trl_loss.gradient_geometry(self, model, inputs, loss)
        rows = self._metric_rows("train")
        rows["geometry/cosine"].append(cosine)
        rows["geometry/norm_ratio"].append(norm_ratio)

    def _log_loss_metrics(self, mode, entropies, mask, inputs, touched: dict[str, torch.Tensor]) -> None:
        """TRL logs entropy, clip ratios, KL, aux loss; ours, per micro-batch over every rank's rows: the
        entropy of the rule's selected tokens, and `token_fractions` (tokens/trained_frac, tokens/touched_frac)."""
        selected = inputs["token_selected"] * mask
        trained, touched_any = token_fractions(inputs["token_weights"], mask, touched)
        totals = self.accelerator.reduce(
            torch.stack(
                [
                    (entropies * selected).sum(),
                    selected.sum().float(),
                    trained.sum().float(),
                    touched_any.sum().float(),
                    (mask > 0).sum().float(),
                ]
            ),
            reduction="sum",
        )
        m = self._metric_rows(mode)
        m["tokens/entropy_selected"].append((totals[0] / totals[1].clamp(min=1.0)).item())
        m["tokens/trained_frac"].append((totals[2] / totals[4].clamp(min=1.0)).item())
        m["tokens/touched_frac"].append((totals[3] / totals[4].clamp(min=1.0)).item())

    # ---- rule state in checkpoints ----------------------------------------------------------
    def before_checkpoint(self, folder: Path) -> None:
        """Write rule_state.json into the checkpoint folder before transformers writes the checkpoint.

        A checkpoint counts as complete once transformers has written trainer_state.json, near the
        end of `Trainer._save_checkpoint` (transformers 5.24); a callback's `on_save` runs only
        after that, so a crash in between left a "complete" checkpoint without rule state.
        """
        atomic_write_json(folder / RULE_STATE_FILE, self.rule_state.to_dict())

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


def _check_supported(t: trl_internals.GRPOSteps) -> None:
    """Refuse the TRL features that do not compose with token weights, each with its reason (docs/trl_parity.md)."""
    problems = trl_loss.refusals(t)
    if problems:
        raise ValueError(f"TokenRuleGRPOTrainer does not support {'; '.join(problems)}")
