"""The controls (stare_lab.core.controls): the untrained model `base` and the random-reward control.

- `method=base` trains 0 steps, loads no trainer, and its evaluation is the starting checkpoint's under
  the same settings and evaluation seed (compared sample by sample with evaluate_model on the model);
- `task.reward: random` draws Bernoulli(p) independent of the completion and its correctness;
- a sweep's `controls:` adds one run per seed of each; a misspelt control is one line;
- `table` shows the base row above the baseline with the RL gain, in Markdown, LaTeX and CSV.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml
from fixtures_runs import SETTINGS, SWEEP, write_run

from stare_lab.analysis import collect_problems, collect_runs, results_table
from stare_lab.config.run_config import ConfigError, compose, save_config
from stare_lab.evaluation.run_eval import evaluate_model
from stare_lab.models import load_model_and_tokenizer
from stare_lab.record import read_eval_results, read_metrics
from stare_lab.run.runner import execute
from stare_lab.tasks import build_task
from stare_lab.tasks.rewards import bernoulli_reward, training_rewards

EVAL = ["logger=none", "task.heldout_size=10", "eval.n=4", "eval.batch_size=40"]


def _samples(run_dir) -> pd.DataFrame:
    [result] = [r for r in read_eval_results(run_dir) if r.get("final")]
    return pd.read_parquet(run_dir / "eval" / "arithmetic" / f"{result['settings_key']}.parquet")


def test_base_run_evaluates_the_starting_checkpoint_without_a_trainer(tmp_path, monkeypatch):
    cfg = compose(["method=base", "seed=3", *EVAL])
    assert cfg.trainer.max_steps == 0 and cfg.method.params == {}
    run_dir = tmp_path / "base"
    save_config(cfg, run_dir / "config.yaml")
    # loading the trainer would build a TokenRuleGRPOTrainer: make that impossible
    import stare_lab.run.runner as runner

    monkeypatch.setattr(runner, "build_trainer", lambda *a, **k: pytest.fail("base built a trainer"))
    execute(run_dir)
    assert not (run_dir / "final").exists() and not (run_dir / "checkpoints").exists()
    assert read_metrics(run_dir) == []
    got = _samples(run_dir)

    # the same evaluation of the shipped model, done by hand into another record
    other = tmp_path / "by_hand"
    save_config(cfg, other / "config.yaml")
    model, tokenizer = load_model_and_tokenizer("builtin")
    model.eval()
    evaluate_model(model, tokenizer, cfg, other, step=0)
    want = _samples(other)
    assert len(got) == 10 * 4
    pd.testing.assert_frame_equal(got, want)
    # the evaluation seed is the run's: another seed samples otherwise
    cfg4 = compose(["method=base", "seed=4", *EVAL])
    d4 = tmp_path / "base4"
    save_config(cfg4, d4 / "config.yaml")
    execute(d4)
    assert not _samples(d4)["answer"].equals(got["answer"])


def test_zero_steps_with_any_rule_is_base_under_that_rule(tmp_path):
    cfg = compose(["method=stare", "trainer.max_steps=0", *EVAL])
    assert cfg.method.name == "stare" and cfg.trainer.max_steps == 0
    run_dir = tmp_path / "zero"
    save_config(cfg, run_dir / "config.yaml")
    execute(run_dir)
    base = compose(["method=base", *EVAL])
    d = tmp_path / "base"
    save_config(base, d / "config.yaml")
    execute(d)
    pd.testing.assert_frame_equal(_samples(run_dir), _samples(d))


def test_negative_steps_and_params_of_base():
    with pytest.raises(ConfigError, match="max_steps"):
        compose(["trainer.max_steps=-1"])
    # base ignores a trainer's steps: it is the untrained model whatever the trainer block says
    assert compose(["method=base", "trainer.max_steps=50"]).trainer.max_steps == 0


@pytest.mark.parametrize("p", [0.5, 0.2])
def test_random_reward_is_bernoulli_p_and_ignores_correctness(p):
    reward = bernoulli_reward(p, seed=7)
    draws = np.concatenate(
        [reward(["x"] * 500, trainer_state=SimpleNamespace(global_step=step)) for step in range(40)]
    )  # 20,000 draws
    assert set(np.unique(draws)) <= {0.0, 1.0}
    assert abs(draws.mean() - p) < 4 * np.sqrt(p * (1 - p) / len(draws))
    # a verifier that is always right (every completion correct) and one always wrong get the same draws:
    # the reward never reads the completion
    task = SimpleNamespace(name="arithmetic", reward=lambda completions, answer, **k: [1.0] * len(completions))
    funcs, weights = training_rewards(task, {"reward": "random", "reward_p": p}, seed=7)
    assert weights == [1.0, 0.0] and funcs[1](["a"], ["1"]) == [1.0]
    state = SimpleNamespace(global_step=3)
    right = funcs[0](["133#"] * 64, answer=["133"] * 64, trainer_state=state)
    wrong = funcs[0](["0#"] * 64, answer=["133"] * 64, trainer_state=state)
    assert right == wrong == reward(["?"] * 64, trainer_state=state)
    # independent of correctness: over many steps, P(reward=1 | correct) = P(reward=1 | wrong) = p
    correct = np.tile([True, False], 250)
    hits = np.array([reward(["?"] * 500, trainer_state=SimpleNamespace(global_step=s)) for s in range(40)])
    on_right, on_wrong = hits[:, correct].mean(), hits[:, ~correct].mean()
    assert abs(on_right - on_wrong) < 4 * np.sqrt(2 * p * (1 - p) / (hits.size / 2))
    # seeded: the same (seed, step) redraws the same rewards (a resumed run); another step or seed does not
    assert reward(["?"] * 64, trainer_state=state) == bernoulli_reward(p, seed=7)(["?"] * 64, trainer_state=state)
    assert reward(["?"] * 64, trainer_state=state) != bernoulli_reward(p, seed=8)(["?"] * 64, trainer_state=state)


def test_reward_keys_are_recorded_and_named_by_the_run_id():
    verifier = compose(["logger=none"])
    random = compose(["logger=none", "task.reward=random"])
    assert random.task.reward == "random" and random.task.reward_p == 0.5
    assert random.run.id != verifier.run.id
    assert compose(["logger=none", "task.reward=random", "task.reward_p=0.3"]).run.id != random.run.id
    with pytest.raises(ConfigError, match="task.reward"):
        compose(["task.reward=format"])  # format is the math task's (\boxed{})
    with pytest.raises(ConfigError, match="task.reward_p"):
        compose(["task.reward=random", "task.reward_p=1.5"])
    # the task itself is built without the reward keys
    assert build_task(random.task).name == "arithmetic"


def test_format_reward_of_the_math_task():
    from stare_lab.tasks.rewards import format_reward

    assert format_reward(["so \\boxed{7}", "no box", "\\boxed{}", "\\boxed{x+1} and more"]) == [1.0, 0.0, 0.0, 1.0]


def _sweep_file(tmp_path, controls) -> str:
    data = {
        "name": "ctl",
        "base": {"model": "builtin", "task": "arithmetic", "trainer": "cpu_small", "logger": "none"},
        "grid": {"method": ["full", "stare"]},
        "controls": controls,
        "seeds": [0, 1],
        "output": str(tmp_path / "runs"),
    }
    path = tmp_path / "ctl.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_controls_expand_one_run_per_seed(tmp_path):
    from stare_lab.plan.expand import expand_sweep
    from stare_lab.plan.schema import load_sweep

    runs = expand_sweep(load_sweep(_sweep_file(tmp_path, ["base", "random_reward"])))
    labels = [r.label for r in runs]
    assert labels[-4:] == ["base seed=0", "base seed=1", "random_reward seed=0", "random_reward seed=1"]
    base, rr = runs[-4].config, runs[-2].config
    assert base["method"]["name"] == "base" and base["trainer"]["max_steps"] == 0
    assert (
        rr["method"]["name"] == "full" and rr["task"]["reward"] == "random" and rr["run"]["variant"] == "random_reward"
    )
    full = next(r.config for r in runs if r.label == "full seed=0")
    # the control differs from the baseline in its reward alone
    assert {k: v for k, v in rr.items() if k not in ("task", "run")} == {
        k: v for k, v in full.items() if k not in ("task", "run")
    }


def test_misspelt_control_is_one_line(tmp_path):
    import subprocess

    path = _sweep_file(tmp_path, ["bse"])
    out = subprocess.run(
        [sys.executable, "-m", "stare_lab.cli", "sweep", "run", path, "--dry-run"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "controls[0]: unknown control 'bse' (did you mean 'base'?); valid: base, random_reward" in out.stderr
    assert not (tmp_path / "runs").exists()


VERIFIER = {"task.reward": "verifier", "task.reward_p": 0.5}
ARITHMETIC_40 = {"arithmetic": {**SETTINGS["arithmetic"], "num_problems": 40}}


def _table_rows(md: str) -> dict[str, str]:
    """The results table's rows by rule (not the seeds-needed table's below it)."""
    rows: dict[str, str] = {}
    for line in md.split("\n\n", 2)[1].splitlines():
        if line.startswith("| ") and not line.startswith("| rule"):
            rows[line.split("|")[1].strip()] = line
    return rows


def _control_sweep(root):
    """base 30/32/34 %, full 70/72/74 %, random_reward 31/33/35 % on 40 problems × 32 samples."""
    arithmetic = ARITHMETIC_40
    for seed, (b, f, r) in enumerate([(0.30, 0.70, 0.31), (0.32, 0.72, 0.33), (0.34, 0.74, 0.35)], start=1):
        write_run(root, "base", None, seed, evals={"arithmetic": b}, settings=arithmetic)
        write_run(root, "full", None, seed, evals={"arithmetic": f}, settings=arithmetic, extra_config=VERIFIER)
        write_run(
            root,
            "full",
            "random_reward",
            seed,
            evals={"arithmetic": r},
            settings=arithmetic,
            extra_config={"task.reward": "random", "task.reward_p": 0.5},
        )
    return root / SWEEP


def test_table_shows_base_first_with_the_rl_gain_and_the_control(tmp_path):
    folder = _control_sweep(tmp_path)
    table = results_table(collect_runs(folder), per_problem=collect_problems(folder))
    assert table.rules == ["base", "full", "random_reward"]
    md = table.to_markdown()
    rows = _table_rows(md)
    cell = table.cells.set_index("rule").loc["base"]
    assert cell["delta"] == pytest.approx(-0.40)
    assert (
        f"RL gain of full +40.0 [{-cell['ci_hi'] * 100:+.1f}, {-cell['ci_lo'] * 100:+.1f}] significant" in rows["base"]
    )
    assert "**" in rows["base"]  # bold: the gain survives Holm
    # the RL gain is a Holm family of its own: random_reward's test does not adjust it, nor it random_reward's
    assert cell["p_holm"] == cell["p_value"]
    rr = table.cells.set_index("rule").loc["random_reward"]
    assert rr["p_holm"] == rr["p_value"]
    assert "random_reward" in rows and "(-39.0" in rows["random_reward"]
    assert "its cell gives the RL gain of full (full − base)" in md
    assert "task.reward: verifier (full), random (random_reward: the control)" in md
    latex = table.to_latex()
    assert r"\textbf{32.0 $\pm$ 2.0 (RL gain of full +40.0" in latex
    csv = pd.read_csv(__import__("io").StringIO(table.to_csv()))
    base = csv.set_index("rule").loc["base"]
    assert base["rl_gain_pts"] == pytest.approx(40.0)
    assert base["rl_gain_lo_pts"] == pytest.approx(-cell["ci_hi"] * 100)
    assert base["rl_gain_hi_pts"] == pytest.approx(-cell["ci_lo"] * 100)
    assert np.isnan(csv.set_index("rule").loc["full", "rl_gain_pts"])


def test_a_small_gain_is_shown_but_not_bold(tmp_path):
    arithmetic = ARITHMETIC_40
    for seed, (b, f) in enumerate([(0.50, 0.52), (0.55, 0.50), (0.45, 0.49)], start=1):
        write_run(tmp_path, "base", None, seed, evals={"arithmetic": b}, settings=arithmetic)
        write_run(tmp_path, "full", None, seed, evals={"arithmetic": f}, settings=arithmetic)
    folder = tmp_path / SWEEP
    md = results_table(collect_runs(folder), per_problem=collect_problems(folder)).to_markdown()
    base = _table_rows(md)["base"]
    assert "RL gain of full +0.3" in base and "significant" not in base and "**" not in base
