"""`trainer.delta` (TRL's two-sided clipping, verl's dual clip c) from the run config to the trainer (issue 27.2):
a run or sweep sets it, `GRPOConfig` and the rules' `TrainerValues` get it, a rule with its own dual clip or
none refuses it in one line (exit 2, nothing launched), a value ≤ 1 is out of range, and a run that leaves
it null keeps the run id it had before the key existed."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf
from sweep_fixtures import write_sweep

from stare_lab.cli.sweep import main
from stare_lab.config.run_config import ConfigError, compose, run_id
from stare_lab.methods import TrainerValues
from stare_lab.run.runner import build_grpo_config


def test_the_config_carries_delta_to_trls_config_and_the_rules(tmp_path):
    cfg = compose(["method=adv_reweight", "trainer.delta=10"])
    assert cfg.trainer.delta == 10.0
    assert build_grpo_config(cfg, tmp_path).delta == 10.0
    assert TrainerValues.from_config(cfg.trainer).delta == 10.0
    plain = compose(["method=full"])
    assert plain.trainer.delta is None and build_grpo_config(plain, tmp_path).delta is None


def test_a_null_delta_keeps_the_run_id_it_had_before_the_key():
    cfg = OmegaConf.to_container(compose(["method=full"]), resolve=True)
    without = copy.deepcopy(cfg)
    del without["trainer"]["delta"]
    assert run_id(cfg) == run_id(without)
    cfg["trainer"]["delta"] = 10.0
    assert run_id(cfg) != run_id(without)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["method=clip_cov", "trainer.delta=2"], "clip_cov"),
        (["method=kl_cov", "trainer.delta=10"], "kl_cov"),
        (["method=archer", "trainer.delta=10"], "archer"),
        (["method=full", "trainer.delta=1.0"], "trainer.delta"),
    ],
)
def test_refusals_are_one_line(overrides, words):
    with pytest.raises(ConfigError, match=words) as e:
        compose(overrides)
    assert "\n" not in str(e.value)


def test_a_sweep_with_delta_beside_a_rules_own_dual_clip_is_exit_2_and_launches_nothing(tmp_path, capsys):
    path = write_sweep(tmp_path, "delta_clip_cov", overrides={"trainer.delta": 10.0}, grid={"method": ["clip_cov"]})
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "clip_cov" in err[0] and "delta=10.0" in err[0], err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("status.json"))
