"""Kept batches for every rule: a rule that chooses its tokens in the loss (scope microbatch or token) or
changes the loss keeps, with the generation batch, what it used and did in the loss at each micro-batch
of each pass (the training forward's statistics, weights, selected and touched tokens). Real TRL
training on the tiny built-in model; the record is checked against the inputs the loss actually had,
against the rule run again on it, and against the trainer's own tokens/trained_frac and touched_frac."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fixtures_trainer import grpo_config, length_reward

from stare_lab.methods import get_method
from stare_lab.training.kept_batches import KEPT_ROW
from stare_lab.training.token_weights import token_fractions
from stare_lab.training.trainer import TokenRuleGRPOTrainer
from stare_lab.viewer import kept_steps, load_run_batch
from stare_lab.viewer.page import render_run
from stare_lab.viewer.selection import apply_all_rules, fractions, replay
from stare_lab.viewer.wandb_export import page_data


def _train(tiny_arithmetic, tmp_path, rule, *, steps=3, every=1, **kw):
    """Train with keep_batches_every; returns the trainer, the run dir and what each loss call of a kept
    batch's rows had in TRL's inputs after the loss: [(kept rows, weights, selected, step)]."""
    tok, model, task = tiny_arithmetic
    trainer = TokenRuleGRPOTrainer(
        model=copy.deepcopy(model),
        reward_funcs=[length_reward],
        args=grpo_config(
            tmp_path,
            **{
                "gradient_accumulation_steps": 2,
                "max_steps": steps,
                "learning_rate": 3e-2,
                **kw,
            },
        ),
        train_dataset=task.train_dataset(),
        processing_class=tok,
        rule=rule,
        keep_batches_every=every,
        run_dir=tmp_path / "run",
    )
    loss, seen = trainer._compute_loss, []

    def spy(model, inputs):
        out = loss(model, inputs)
        if KEPT_ROW in inputs and trainer.model.training:
            seen.append(
                (
                    inputs[KEPT_ROW].clone(),
                    inputs["token_weights"].clone(),
                    inputs["token_selected"].clone(),
                    trainer.state.global_step + 1,
                )
            )
        return out

    trainer._compute_loss = spy
    trainer.train()
    return trainer, tmp_path / "run", seen


CASES = {
    # scope microbatch, changes the loss; KL-Cov acts from the second pass on
    "kl_cov": (get_method("kl_cov"), dict(gradient_accumulation_steps=2, num_iterations=2)),
    # scope microbatch; a Cov band wide enough to detach tokens of the tiny model
    "clip_cov": (get_method("clip_cov", ratio=0.1, lb=-100.0, ub=100.0), dict(gradient_accumulation_steps=2)),
    # weights at generation, changes the loss: a trust region small enough to be left on the second pass
    "dppo": (get_method("dppo", delta=1e-4), dict(gradient_accumulation_steps=2, num_iterations=2)),
    # scope token, two passes with weights of their own
    "lopti": (get_method("lopti"), dict(gradient_accumulation_steps=1, steps_per_generation=2, num_iterations=2)),
    # scope token
    "entropy_adv": (get_method("entropy_adv"), dict(gradient_accumulation_steps=2)),
    # scope microbatch with a statistic of the whole generation batch (the gate's H̄) and memory
    "stare": (
        get_method("stare", scope="microbatch", H_tgt=10.0, adaptive=True, normalize="selected"),
        dict(gradient_accumulation_steps=2, steps_per_generation=4),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_rule_in_the_loss_keeps_its_batches_with_what_it_did_there(tiny_arithmetic, tmp_path, name):
    rule, kw = CASES[name]
    steps = 4
    trainer, run, seen = _train(tiny_arithmetic, tmp_path, rule, steps=steps, **kw)
    accumulation = trainer.args.gradient_accumulation_steps
    per_batch = trainer.args.steps_per_generation * trainer.num_iterations // accumulation  # steps per batch
    assert kept_steps(run) == list(range(0, steps, per_batch))  # every generation step is a multiple of 1
    rows = trainer.state.log_history[:-1]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    by_step = {r["step"]: r for r in rows}
    checked = 0
    for kept in kept_steps(run):
        batch = load_run_batch(run, kept)
        meta = batch.loss_meta
        assert (
            meta["iterations"] == trainer.num_iterations and meta["micro_batches"] == trainer.args.steps_per_generation
        )
        assert meta["selects_in_loss"] == trainer.selects_in_loss and meta["changes_loss"] == rule.changes_loss
        assert meta["normalize"] == getattr(rule.params, "normalize", "valid")
        # the passes that ended before the run did; each covers every row exactly once
        passes_done = min(trainer.num_iterations, (steps - kept) * accumulation // trainer.args.steps_per_generation)
        assert [u.index for u in batch.updates] == list(range(passes_done))
        valid = batch.mask > 0
        calls = [c for c in seen if kept < c[3] <= kept + per_batch]  # this batch's loss calls, in order
        for u in batch.updates:
            assert sorted(u.micro_batch.tolist()) == sorted(
                list(range(meta["micro_batches"])) * meta["rows_per_micro_batch"]
            )
            assert not torch.isnan(u.logp[valid]).any() and not torch.isnan(u.entropy[valid]).any()
            # what the loss had in TRL's inputs, micro-batch by micro-batch, is what the record holds
            for mb, (kept_rows, weights, selected, step) in enumerate(
                calls[u.index * meta["micro_batches"] :][: meta["micro_batches"]]
            ):
                assert (u.micro_batch[kept_rows] == mb).all() and u.steps[mb] == step
                assert torch.equal(u.position[kept_rows], torch.arange(kept_rows.numel()))
                assert torch.equal(u.weights[kept_rows], weights.float())
                assert torch.equal(u.selected[kept_rows], selected > 0)
                checked += 1
            # the trainer's tokens/trained_frac and touched_frac of each step: the mean over its micro-batches
            for step in sorted(set(u.steps)):
                shares = []
                for mb in [i for i, s in enumerate(u.steps) if s == step]:
                    r = u.micro_batch == mb
                    trained, touched = token_fractions(
                        u.weights[r], batch.mask[r], {k: m[r] for k, m in u.touched.items()}
                    )
                    n = float(valid[r].sum())
                    shares.append((float(trained.sum()) / n, float(touched.sum()) / n))
                logged = by_step[step]
                assert logged["tokens/trained_frac"] == pytest.approx(np.mean([s[0] for s in shares]), rel=1e-6)
                assert logged["tokens/touched_frac"] == pytest.approx(np.mean([s[1] for s in shares]), rel=1e-6)
                # the rules' own counts, as their docstrings state them (docs/run_record.md, "Token fractions")
                expected = {
                    "kl_cov": (1.0, logged.get("rule/penalised_frac")),
                    "clip_cov": (1.0 - logged.get("rule/detached_frac", 0.0), logged.get("rule/detached_frac")),
                    "dppo": (1.0, logged.get("rule/dropped_frac")),
                }.get(name)
                if expected is not None:
                    assert logged["tokens/trained_frac"] == pytest.approx(expected[0], rel=1e-6, abs=1e-9)
                    assert logged["tokens/touched_frac"] == pytest.approx(expected[1], rel=1e-6, abs=1e-9)
        # the rule run again on the record, micro-batch by micro-batch, gives what it recorded
        views = apply_all_rules(batch)
        own = [v for v in views if v.own]
        assert len(own) == len(batch.updates) and all(v.reproduces for v in own), [v.replay_note for v in own]
        replayed = replay(batch)
        assert not isinstance(replayed, str)
    assert checked >= trainer.args.steps_per_generation
    # what each rule is expected to have done in the loss
    batch = load_run_batch(run, 0)
    last = batch.updates[-1]
    valid = batch.mask > 0
    if name == "kl_cov":
        (how,) = last.touched
        assert torch.equal(last.touched[how], last.selected) and last.touched[how].sum() >= meta["micro_batches"]
        assert torch.equal(last.weights[valid], torch.ones(int(valid.sum())))
    elif name == "clip_cov":
        detached = valid & (last.weights == 0)
        assert detached.any() and torch.equal(last.selected, valid & ~detached)
    elif name == "dppo":  # on-policy nothing is outside the trust region; on the second pass some are
        first, second = batch.updates
        assert not any(m.any() for m in first.touched.values())
        assert any(m.any() for m in second.touched.values())
    elif name == "lopti":  # the two passes have weights of their own
        assert not torch.equal(batch.updates[0].weights, batch.updates[1].weights)


def test_the_page_shows_the_rule_as_it_trained(tiny_arithmetic, tmp_path):
    """`stare-lab view` of a KL-Cov run: its rule as it trained in each pass (replayed: the same), trained
    100 %, touched its penalised tokens; the other rules on the kept batch; signals of the training forward."""
    rule, kw = CASES["kl_cov"]
    _, run, _ = _train(tiny_arithmetic, tmp_path, rule, steps=2, **kw)
    page = render_run(run, 0, tmp_path / "page.html")
    html = page.read_text()
    assert "keep_batches_every" not in html
    (arm,) = page_data(page)["arms"]
    own = [r for r in arm["rules"] if r["own"]]
    assert [r["key"] for r in own] == ["run:kl_cov", "run:kl_cov@2"]
    assert [r["label"] for r in own] == [
        "kl_cov (this run, in the loss, pass 1 of 2)",
        "kl_cov (this run, in the loss, pass 2 of 2)",
    ]
    assert all(r["reproduces_training"] is True and r["trained_frac"] == 1.0 for r in own)
    for r in own:
        assert r["touched_frac"] == pytest.approx(r["selected_frac"]) and 0 < r["touched_frac"] < 0.1
        assert r["touched_frac"] == pytest.approx(r["metrics"]["touched: KL-penalised (top Cov)"])
    full = next(r for r in arm["rules"] if r["key"] == "full")
    assert full["trained_frac"] == 1.0 and full["touched_frac"] == 0.0
    assert "the rule chose its tokens in the loss: 2 of 2 pass(es)" in arm["info"]
    keys = [s["key"] for s in arm["signals"]]
    assert "loss0:entropy" in keys and "loss1:surprisal" in keys


def test_viewer_fractions_are_the_trainers_definition(tmp_path):
    """trained = weight ≠ 0, touched = weight ≠ 1 or in a loss-changing rule's sets, over valid tokens,
    worked by hand on one 2 × 4 batch."""
    from stare_lab.viewer.selection import RuleView

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]).float()
    weights = torch.tensor([[1.0, 0.0, 1.1, 0.0], [1.0, 1.0, 0.0, 0.0]])
    penalised = torch.tensor([[True, False, False, True], [False, True, False, False]])
    trained, touched = token_fractions(weights, mask, {"penalised": penalised})
    assert trained.tolist() == [[True, False, True, False], [True, True, False, False]]
    assert touched.tolist() == [[True, True, True, False], [False, True, False, False]]
    view = RuleView("x", "x", {}, weights=weights, selected=mask > 0, touched={"penalised": penalised})
    assert fractions(view, mask) == (4 / 5, 4 / 5)
    view.touched = {}
    assert fractions(view, mask) == (4 / 5, 2 / 5)


def test_a_run_without_kept_batches_is_told_why_from_its_record(tmp_path, capsys):
    """The issue's case: a clip_cov run trained by a version that kept nothing in the loss, with
    keep_batches_every set; `stare-lab view` says so instead of asking to set it. Then the other reasons."""
    from stare_lab.config.run_config import compose, save_config
    from stare_lab.record import new_status, write_status
    from stare_lab.record.kept_batch import why_no_batch
    from stare_lab.viewer.page import main_view

    run = tmp_path / "clip_cov_run"
    save_config(compose(["method=clip_cov", "trainer.keep_batches_every=5"]), run / "config.yaml")
    write_status(run, {**new_status(), "state": "finished"})
    assert main_view([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "keep_batches_every=5 but kept none (rule clip_cov (scope microbatch)" in err
    assert "set trainer.keep_batches_every" not in err and "run it again to keep them" in err
    write_status(run, {**new_status(), "state": "failed", "error": "CUDA out of memory\nTraceback ..."})
    assert why_no_batch(run) == "it failed before keeping one (CUDA out of memory)"
    write_status(run, {**new_status(), "state": "running"})
    assert why_no_batch(run) == "it is running and has kept none yet (trainer.keep_batches_every=5)"
    save_config(compose(["method=clip_cov"]), run / "config.yaml")
    assert why_no_batch(run) == "trainer.keep_batches_every is 0: set it to keep batches"
    assert why_no_batch(tmp_path / "nowhere") == "it has not started (no run folder yet)"
