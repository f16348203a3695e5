"""scope "microbatch" against slow references of the official codes (hp-luo/STARE and the 80/20 code, on
verl's legacy dp_actor), on real runs whose generation batches TRL splits into 2 micro-batches.

What the official codes do, read from them (and written here as loops, not copied):
- verl `dp_actor.update_policy`: per micro-batch, the loss is `agg_loss(..., "token-mean")` of that
  micro-batch (Σ over its tokens / its token count; the 80/20 code counts `response_mask *
  entropy_top_mask`) times `loss_scale_factor` = 1 / gradient_accumulation (the micro-batch's share
  of the step's rows), on the log-probs and entropies of the training forward (temperature-scaled).
- 80/20 `get_global_entropy_top_mask`: the top k = max(1, int(n·ρ + 0.9999)) valid tokens of the
  micro-batch by entropy.
- STARE `compute_stare_token_weights`: L+ = the top k = max(1, int(c·P + 0.999999)) of the c valid
  tokens with A > 0 by surprisal −log π of the training forward (L- likewise for A < 0, C2); W on
  L+, M on L-, 1 elsewhere, only while the controller's gate is on. `STAREController.update` runs
  once per step, before the update, on H̄ = token mean of the old-log-prob pass's entropies over the
  whole step batch: gate = H̄ < H_tgt; adaptive: W ← clip(W + α·sgn(H_tgt − H̄), 1, W_max), M likewise.
On policy (one update per generation batch) the ratio is 1, so ∂loss/∂log π_t = −A_t·w_t·m_t / (D·GA).
Ties at the top-k boundary (equal surprisal of equal tokens after equal prefixes) may be broken
differently: there the count and the multiset of selected scores must match.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from fixtures_trainer import grpo_config
from microbatch_support import (
    GA,
    TAU,
    G,
    assert_same_selection,
    check_run,
    microbatch_trainer,
    record_micro_batches,
    setup,  # noqa: F401
    verl_denominator,
)
from transformers import Qwen2ForCausalLM

from stare_lab.methods import RuleState, get_method, list_methods
from stare_lab.models.builtin import BUILTIN_DIR, build_tokenizer
from stare_lab.stats import TokenStats
from stare_lab.tasks.arithmetic import ArithmeticTask
from stare_lab.training.objective import token_loss
from stare_lab.training.trainer import TokenRuleGRPOTrainer


# ---- slow references of the official codes -----------------------------------------------------
def ref_top(score, candidates, frac, round_up):
    """The official top-k: k = max(1, int(c·frac + round_up)) of the c candidates by score, as a set of (i, t)."""
    cells = [(i, t) for i in range(score.size(0)) for t in range(score.size(1)) if candidates[i, t]]
    if not cells or frac <= 0:
        return set()
    k = min(max(1, int(len(cells) * frac + round_up)), len(cells))
    return set(sorted(cells, key=lambda c: -float(score[c]))[:k])


def ref_top_entropy(entropy, mask, rho):
    """80/20's get_global_entropy_top_mask on one micro-batch: 0/1 weights."""
    w = torch.zeros(mask.shape)
    for c in ref_top(entropy, mask > 0, rho, 0.9999):
        w[c] = 1.0
    return w, w.clone()


def ref_stare(logp, advantages, mask, variant, P, gate, W, M):
    """STARE's compute_stare_token_weights on one micro-batch: weights (1 on every valid token but L+ / L-)."""
    A = advantages[:, None].expand(mask.shape)
    valid = mask > 0
    plus = ref_top(-logp, valid & (A > 0), P, 0.999999)
    minus = ref_top(-logp, valid & (A < 0), P, 0.999999) if variant == "C2" else set()
    w = mask.clone().float()
    if gate:
        for c in plus:
            w[c] = W
        for c in minus:
            w[c] = M
    return w, torch.ones(mask.shape)  # the loss's token mean counts every valid token


class RefController:
    """STAREController: the gate and the adaptive W/M, updated once per step from the step batch's H̄."""

    def __init__(self, p):
        self.p, self.W, self.M, self.gate = p, p.W, p.M, True

    def update(self, H):
        if not math.isfinite(H):
            return
        self.gate = H < self.p.H_tgt
        if self.p.adaptive and self.p.alpha != 0:
            sign = float((self.p.H_tgt > H) - (self.p.H_tgt < H))
            self.W = min(max(self.W + self.p.alpha * sign, 1.0), self.p.W_max)
            self.M = min(max(self.M - self.p.alpha * sign, self.p.M_min), 1.0)


# ---- tests -------------------------------------------------------------------------------------
def _rules_with_the_scope():
    return [r for r in list_methods() if hasattr(get_method(r).params, "scope")]


@pytest.mark.parametrize("name", _rules_with_the_scope())
def test_the_rule_state_step_advances_in_microbatch_mode(setup, tmp_path, name):
    try:
        trainer = microbatch_trainer(setup, tmp_path, get_method(name, scope="microbatch"))
    except ValueError as e:  # the rule reads a statistic the training forward does not give, or has no such scope
        assert "scope='microbatch' selects from the training forward" in str(
            e
        ) or "scope='microbatch' is not one of" in str(e)
        pytest.skip(f"{name} does not accept scope microbatch")
    seen = []
    weights = trainer._microbatch_weights

    def spy(*args):
        seen.append((trainer.state.global_step, trainer.rule_state.step))
        return weights(*args)

    trainer._microbatch_weights = spy
    trainer.train()
    assert seen == [(0, 0), (0, 0), (1, 1), (1, 1), (2, 2), (2, 2)]


def test_top_entropy_microbatch_is_the_80_20_code(setup, tmp_path):
    rho = 0.2
    steps = record_micro_batches(
        microbatch_trainer(setup, tmp_path, get_method("top_entropy", scope="microbatch", rho=rho))
    )

    def reference(micro, k):
        return ref_top_entropy(micro["entropy"], micro["inputs"]["completion_mask"], rho)

    reference.score = "entropy"
    check_run(steps, reference, verl_denominator)


@pytest.mark.parametrize("name", ["random", "low_entropy", "gmts", "opefo"])
def test_other_rules_of_the_scope_select_per_micro_batch_with_verls_aggregation(setup, tmp_path, name):
    """No official code runs these per micro-batch: the reference is the rule itself on each micro-batch
    alone (its statistics from the training forward, the step's seed), aggregated as verl does."""
    trainer = microbatch_trainer(setup, tmp_path, get_method(name, scope="microbatch"), steps=2)
    steps = record_micro_batches(trainer)
    batch_rule = get_method(name, scope="batch")

    def reference(micro, k):
        inputs = micro["inputs"]
        mask = inputs["completion_mask"]
        stats = TokenStats(
            logp=micro["logp"],
            mask=mask,
            advantages=inputs["advantages"],
            group=torch.arange(mask.size(0)),
            entropy=micro["entropy"],
            old_logp=micro["logp"],
        )
        out = batch_rule(stats, RuleState(step=k, seed=0, trainer=trainer.trainer_values))
        return out.weights, (out.weights if out.normalize == "selected" else torch.ones(mask.shape))

    reference.score = "entropy"
    check_run(steps, reference, verl_denominator)


def _stare_reference(p, steps):
    controller, plan = RefController(p), []
    for step in steps:
        controller.update(step["H"])
        plan.append((controller.gate, controller.W, controller.M))

    def reference(micro, k):
        gate, W, M = plan[k]
        inputs = micro["inputs"]
        return ref_stare(micro["logp"], inputs["advantages"], inputs["completion_mask"], p.variant, p.P, gate, W, M)

    reference.score = "surprisal"
    return reference, plan


@pytest.mark.parametrize(
    "params",
    [
        {"variant": "O1", "H_tgt": 10.0},  # gate open
        {"variant": "O1", "H_tgt": 0.0},  # gate closed: every weight 1
        {"variant": "C2", "H_tgt": 10.0, "P": 0.2},
    ],
    ids=["O1-open", "O1-closed", "C2-open"],
)
def test_stare_microbatch_is_the_official_code(setup, tmp_path, params):
    rule = get_method("stare", scope="microbatch", **params)
    trainer = microbatch_trainer(setup, tmp_path, rule)
    assert trainer.stats_source() == "pass", "H̄ of the step batch: one no-grad pass (a rollout_func sampled)"
    steps = record_micro_batches(trainer)
    reference, plan = _stare_reference(rule.params, steps)
    assert all(gate == (params["H_tgt"] > 0) for gate, _, _ in plan)
    for step in steps:  # the gate's H̄ is the step batch's, the same for both micro-batches
        for micro in step["micro"]:
            assert micro["memory"]["H"] == pytest.approx(step["H"], abs=1e-4)
    check_run(steps, reference, verl_denominator)


def test_stare_adaptive_w_m_over_10_steps_is_the_official_controller(setup, tmp_path):
    rule = get_method(
        "stare", scope="microbatch", variant="C2", P=0.2, H_tgt=10.0, adaptive=True, alpha=0.03, W_max=1.3, M_min=0.8
    )
    steps = record_micro_batches(microbatch_trainer(setup, tmp_path, rule, steps=10))
    reference, plan = _stare_reference(rule.params, steps)
    Ws = [W for _, W, _ in plan]
    assert Ws[0] == pytest.approx(1.13) and Ws[-1] == 1.3 and len(set(Ws)) > 5, "W moves once per step, then saturates"
    for (_, W, M), step in zip(plan, steps, strict=True):
        for micro in step["micro"]:  # once per step: both micro-batches train with the step's W, M
            assert (micro["memory"]["W"], micro["memory"]["M"]) == (W, M)
    check_run(steps, reference, verl_denominator)


def test_trl_aggregation_is_one_option_away(setup, tmp_path):
    rule = get_method("stare", scope="microbatch", H_tgt=10.0)
    steps = record_micro_batches(microbatch_trainer(setup, tmp_path, rule, steps=2, microbatch_aggregation="trl"))
    reference, _ = _stare_reference(rule.params, steps)
    totals = {}
    for k, step in enumerate(steps):  # TRL's dapo: the generation batch's token count
        totals[k] = float(sum(m["inputs"]["completion_mask"].sum() for m in step["micro"]))
        for micro in step["micro"]:
            micro["total"] = totals[k]
            assert float(micro["inputs"]["num_items_in_batch"]) == totals[k]
    check_run(steps, reference, lambda micro, count: micro["total"])
    assert any(
        abs(float(m["inputs"]["completion_mask"].sum()) * GA - totals[k]) > 0.5
        for k, s in enumerate(steps)
        for m in s["micro"]
    ), "micro-batches of unequal token counts, else the two aggregations coincide"


@pytest.mark.parametrize(
    "name,params", [("full", {}), ("stare", {"scope": "microbatch", "H_tgt": 10.0, "variant": "C2", "P": 0.3})]
)
def test_the_trainers_loss_is_objective_token_loss(setup, tmp_path, name, params):
    """DESIGN §4: one micro-batch holding the generation batch; the trainer's loss equals token_loss."""
    rule = get_method(name, **params)
    trainer = microbatch_trainer(setup, tmp_path, rule, per_device_train_batch_size=8, gradient_accumulation_steps=1)
    ds = trainer.train_dataset
    trainer.model.train()
    torch.manual_seed(1)
    out = trainer._generate_and_score_completions([ds[i] for i in range(2) for _ in range(G)])
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    mask = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    T = out["completion_ids"].size(1)
    state = copy.deepcopy(trainer.rule_state)
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop
    loss = trainer._compute_loss(trainer.model, dict(out))
    logp, entropy, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, T, compute_entropy=True)
    stats = TokenStats(
        logp=logp.detach(),
        mask=out["completion_mask"],
        advantages=out["advantages"],
        group=torch.arange(ids.size(0)),
        entropy=entropy.detach(),
    )
    expected = token_loss(rule, stats, state, logp, max_completion_length=trainer.max_completion_length)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-9)
    if name == "stare":
        assert state.memory["gate"] is True, "the gate was open: the weights were not all 1"


# ---- two processes (gloo): selection per process (default, the official codes) or over both ranks ----
def _two_process_run(rank: int, world_size: int, out_dir: Path) -> None:
    import os

    import torch.distributed as dist
    from dist_worker_train import rollout_func
    from dist_worker_trl import completion_reward

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    results = {}
    for ranks in ("process", "gathered"):
        args = grpo_config(
            out_dir / f"run-{ranks}",
            per_device_train_batch_size=4,
            gradient_accumulation_steps=GA,
            num_generations=G,
            max_completion_length=6,
            learning_rate=0.05,
            optim="sgd",
            temperature=TAU,
        )
        trainer = TokenRuleGRPOTrainer(
            model=Qwen2ForCausalLM.from_pretrained(BUILTIN_DIR),
            reward_funcs=[completion_reward],
            args=args,
            processing_class=build_tokenizer(),
            train_dataset=ArithmeticTask(train_size=48, heldout_size=4).train_dataset(),
            rollout_func=rollout_func,
            rule=get_method("top_entropy", scope="microbatch", rho=0.2),
            microbatch_ranks=ranks,
        )
        results[ranks] = record_micro_batches(trainer)
        dist.barrier()
    torch.save(results, out_dir / f"microbatch_rank{rank}.pt")


def _padded(x, T):
    return torch.nn.functional.pad(x, (0, T - x.size(1)))


@pytest.mark.slow
def test_two_processes_select_per_process_by_default_or_over_both_ranks(tmp_path):
    from dist_worker_trl import spawn_env

    spawn_env(_two_process_run, 2, tmp_path)
    ranks = [torch.load(tmp_path / f"microbatch_rank{r}.pt", weights_only=False) for r in range(2)]
    rho, differ = 0.2, 0
    for mode in ("process", "gathered"):
        runs = [r[mode] for r in ranks]
        for k in range(len(runs[0])):
            for j in range(len(runs[0][k]["micro"])):
                micros = [run[k]["micro"][j] for run in runs]
                masks = [m["inputs"]["completion_mask"].float() for m in micros]
                if mode == "process":
                    refs = [ref_top_entropy(m["entropy"], mask, rho)[0] for m, mask in zip(micros, masks, strict=True)]
                else:  # the rule on the micro-batch of both ranks, rows in rank order
                    T = max(mask.size(1) for mask in masks)
                    both = ref_top_entropy(
                        torch.cat([_padded(m["entropy"], T) for m in micros]),
                        torch.cat([_padded(mask, T) for mask in masks]),
                        rho,
                    )[0]
                    B0 = masks[0].size(0)
                    refs = [both[:B0, : masks[0].size(1)], both[B0:, : masks[1].size(1)]]
                    local = [ref_top_entropy(m["entropy"], mask, rho)[0] for m, mask in zip(micros, masks, strict=True)]
                    differ += sum(not torch.equal(a, b) for a, b in zip(refs, local, strict=True))
                for m, mask, ref in zip(micros, masks, refs, strict=True):
                    ours = m["inputs"]["token_weights"]
                    assert_same_selection(ours, ref, m["entropy"], mask)
                    # verl's token mean of this rank's micro-batch over its selected tokens, × 1/GA
                    expected = -m["inputs"]["advantages"][:, None] * ours * mask / ((ours * mask).sum() * GA)
                    torch.testing.assert_close(m["grad"], expected, rtol=1e-5, atol=1e-9)
    assert differ > 0, "on these batches the gathered selection differs from the per-process one"
