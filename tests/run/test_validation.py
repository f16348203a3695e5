"""Every value is checked before anything is launched (issue 12): a bad value on the command line
or in a sweep is one line naming it, exit 2, nothing written, in a few seconds."""

from __future__ import annotations

import pytest
import yaml
from sweep_fixtures import write_sweep

from stare_lab.cli import main

TRAIN_CASES = [
    (["seed=-1"], "seed: must be ≥ 0, got -1"),
    (["seed=18446744073709551616"], "seed: must be < 4294967296"),
    (["eval.benchmarks=[arithmetic,aime2024]"], "eval.benchmarks[1]: unknown benchmark 'aime2024'; valid: aime24"),
    (["eval.n=0"], "eval.n: must be ≥ 1, got 0"),
    (["eval.top_p=2.0"], "eval.top_p: must be ≤ 1, got 2.0"),
    (["eval.top_p=0"], "eval.top_p: must be > 0"),
    (["eval.temperature=-1"], "eval.temperature: must be ≥ 0, got -1.0"),
    (["eval.max_tokens=0"], "eval.max_tokens: must be ≥ 1"),
    (["trainer.max_steps=-5"], "trainer.max_steps: must be ≥ 0, got -5"),  # 0: the untrained model (base)
    (
        ["trainer.num_generations=1", "trainer.per_device_train_batch_size=2"],
        "trainer.num_generations: must be ≥ 2, got 1",
    ),
    (
        ["trainer.num_generations=5"],
        "generation batch (per_device_train_batch_size × steps_per_generation = 24 × 2 = 48) "
        "is not divisible by num_generations = 5",
    ),
    (
        ["trainer.steps_per_generation=3", "trainer.per_device_train_batch_size=4", "trainer.num_generations=8"],
        "= 4 × 3 = 12) is not divisible by num_generations = 8",
    ),
    (["trainer.temperature=0"], "trainer.temperature: must be > 0"),
    (["trainer.top_p=1.5"], "trainer.top_p: must be ≤ 1"),
    (
        ["trainer.loss_type=gspo"],
        "trainer.loss_type: 'gspo' is not one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo",
    ),
    (["trainer.scale_rewards=yes"], "trainer.scale_rewards: 'yes' is not one of group, batch, none"),
    (
        ["trainer.lr_scheduler_type=reduce_lr_on_plateau"],
        "trainer.lr_scheduler_type: 'reduce_lr_on_plateau' is not one of",
    ),
    (["trainer.save_steps=0"], "trainer.save_steps: must be ≥ 1"),
    (["trainer.logging_steps=0"], "trainer.logging_steps: must be ≥ 1"),
    (["trainer.warmup_steps=-1"], "trainer.warmup_steps: must be ≥ 0"),
    (["trainer.learning_rate=nan"], "trainer.learning_rate: must be ≥ 0, got nan"),
    (["model.dtype=float8"], "model.dtype: 'float8' is not one of float32, bfloat16, float16"),
    (["logger.mode=sometimes"], "logger.mode: 'sometimes' is not one of auto, offline, online, disabled"),
    (["method=gmts", "method.params.beta=0.1"], "rule 'gmts': beta=0.1 but trainer.beta=0.0"),
    (["task.train_size=0"], "task.train_size: must be ≥ 1, got 0"),
    (["+task.train_sise=10"], "task.train_sise: unknown key for task 'arithmetic'; valid keys: name, train_size"),
    (["task=math", "task.train_source=x.jsonl", "task.heldout_limit=-1"], "task.heldout_limit: must be ≥ 1, got -1"),
]


@pytest.mark.parametrize("args, needle", TRAIN_CASES, ids=[" ".join(a) for a, _ in TRAIN_CASES])
def test_bad_train_value_is_one_line_exit_2_and_writes_nothing(args, needle, tmp_path, capsys):
    rc = main(["train", *args, f"run.root={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("stare-lab: error: "), err
    assert needle in err, err
    assert not any(tmp_path.iterdir())  # refused before anything was written or loaded


def test_the_defaults_and_the_tiny_settings_pass(tmp_path):
    from omegaconf import OmegaConf

    from stare_lab.config.run_config import check_values, compose

    for overrides in (
        [],
        ["trainer=gpu_stare", "eval=math"],
        ["seed=4294967295", "eval.temperature=0", "eval.top_p=1"],
    ):
        check_values(OmegaConf.to_container(compose(overrides)))


SWEEP_CASES = [
    ("seeds: [0, -1]", "seeds[1]: must be ≥ 0, got -1"),
    ("seeds: [18446744073709551616]", "seeds[0]: must be < 4294967296"),
    ("seeds: 1000000", "seeds: 1,000,000 seeds; a sweep is at most 50,000 runs"),
    (
        "grid: {trainer.learning_rate: RANGE1000, trainer.max_steps: RANGE1000}",
        "1,000,000 runs (grid 1000 × 1000 × 1 variants × 1 seeds); a sweep is at most 50,000 runs",
    ),
    ("eval: {n: 0}", "eval.n: must be ≥ 1, got 0"),
    ("eval: {top_p: 2.0}", "eval.top_p: must be ≤ 1, got 2.0"),
    ("eval: {temperature: -1}", "eval.temperature: must be ≥ 0, got -1"),
    ("eval: {benchmarks: [arithmetic, nope]}", "eval.benchmarks[1]: unknown benchmark 'nope'"),
    ("grid: {trainer.max_steps: [2, -1]}", "grid.trainer.max_steps[1]: must be ≥ 0, got -1"),
    ("grid: {trainer.num_generations: [4, 1]}", "grid.trainer.num_generations[1]: must be ≥ 2, got 1"),
    (
        "variants: {odd: {trainer.num_generations: 3}}",
        "variants.odd.trainer.num_generations: the generation batch "
        "(per_device_train_batch_size × steps_per_generation = 8 × 1 = 8) is not divisible by num_generations = 3",
    ),
    ("launcher: {name: local, workers: 0}", "launcher.workers: must be ≥ 1, got 0"),
    ("launcher: {name: slurm, setup: [1, 2]}", "launcher.setup: expected a list of strings"),
]


@pytest.mark.parametrize("extra, needle", SWEEP_CASES, ids=[c[0][:40] for c in SWEEP_CASES])
def test_bad_sweep_value_is_one_line_exit_2_and_launches_nothing(extra, needle, tmp_path, capsys):
    path = write_sweep(tmp_path, seeds=[0])
    data = yaml.safe_load(path.read_text())
    key = extra.split(":")[0]
    extra = extra.replace("RANGE1000", str([1 + i for i in range(1000)]))
    block = yaml.safe_load(extra)
    if key == "eval":
        data["eval"].update(block["eval"])
    else:
        data.update(block)
    path.write_text(yaml.safe_dump(data))
    rc = main(["sweep", "run", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert str(path) in err and needle in err, err
    assert not (tmp_path / "runs").exists()


def test_a_huge_sweep_file_is_refused_unread(tmp_path, capsys):
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:  # 50 MB of broken YAML: read and parsed, it would give a YAML error instead
        line = b"a: [" + b"x" * 1019 + b"\n"
        for _ in range(50 * 1024):
            f.write(line)
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "52,428,800 bytes; a sweep file is at most 1,048,576 bytes" in err, err


def test_a_non_utf8_sweep_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\nbase: {model: builtin}\n".encode("latin-1"))
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: not UTF-8 text (byte 0xe9 at line 1)" in err, err


def test_sweep_status_refuses_the_same_values(tmp_path, capsys):
    path = write_sweep(tmp_path, seeds=[-3])
    assert main(["sweep", "status", str(path)]) == 2
    assert "seeds[0]: must be ≥ 0, got -3" in capsys.readouterr().err


def test_a_search_range_outside_the_schema_is_refused(tmp_path, capsys):
    search = {
        "params": {"trainer.max_steps": {"low": -1, "high": 4}},
        "objective": {"metric": "train/reward"},
        "trials": 2,
    }
    path = write_sweep(tmp_path, search=search)
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "search.params.trainer.max_steps.low: must be ≥ 0, got -1" in err, err
    assert not (tmp_path / "runs").exists()


def test_a_rule_that_disagrees_with_the_trainer_is_refused_at_expansion(tmp_path, capsys):
    path = write_sweep(tmp_path, variants={"g": {"method": "gmts", "method.params.eps_high": 0.3}})
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "variants.g" in err and "eps_high=0.3 but trainer.epsilon_high=0.28" in err, err
    assert not (tmp_path / "runs").exists()
