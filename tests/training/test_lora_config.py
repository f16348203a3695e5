"""LoRA is a section of the schema (`model.lora`: stare_lab.models.lora.LoraConfig): a dotted key or a mapping
turns it on with the same resolved config, a wrong value or key is one line, and the adapter trains."""

from __future__ import annotations

import json

import pytest

from stare_lab.cli import main
from stare_lab.config.run_config import ConfigError, compose

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def test_dotted_keys_and_a_mapping_resolve_to_the_same_run():
    dotted = compose(["model.lora.r=4", "model.lora.alpha=8"])
    mapping = compose(["model.lora={r: 4, alpha: 8}"])
    assert dotted.run.id == mapping.run.id
    assert dict(dotted.model.lora) == {
        "r": 4,
        "alpha": 8.0,
        "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    }
    assert compose([]).model.lora is None and compose([]).run.id != dotted.run.id


@pytest.mark.parametrize(
    "override, line",
    [
        ("model.lora=abc", "model.lora: expected null or a mapping of alpha, dropout, r, target_modules, got 'abc'"),
        ("model.lora.rank=4", "unknown config key 'model.lora.rank'; valid keys under model.lora: alpha, dropout, r,"),
        ("model.lora={rank: 4}", "unknown config key 'model.lora.rank'; valid keys under model.lora:"),
        ("model.lora.r=0", "model.lora.r: must be ≥ 1, got 0"),
        ("model.lora.dropout=1.5", "model.lora.dropout: must be < 1, got 1.5"),
    ],
)
def test_a_bad_lora_value_is_one_line(override, line):
    with pytest.raises(ConfigError) as e:
        compose([override])
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_a_lora_run_trains_its_adapter(tmp_path):
    run = tmp_path / "run"
    argv = [
        "train",
        "model.lora.r=4",
        "model.lora.target_modules=[q_proj,v_proj]",
        "trainer.max_steps=1",
        "eval.enabled=false",
        "logger=none",
        f"run_dir={run}",
    ]
    assert main(argv) == 0
    adapter = json.loads((run / "final" / "adapter_config.json").read_text())
    assert (
        adapter["r"] == 4 and adapter["lora_alpha"] == 16 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    )


def test_a_sweep_sets_lora_by_dotted_keys_by_a_mapping_and_over_a_grid(tmp_path):
    import yaml

    from stare_lab.plan.expand import expand_sweep, verify_run
    from stare_lab.plan.schema import load_sweep

    path = tmp_path / "lora.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "lora",
                "base": {"overrides": {"model.lora": {"r": 4}, "trainer.max_steps": 2}},
                "grid": {"model.lora.alpha": [8, 32]},
                "variants": {"narrow": {"model.lora.r": 2}, "wide": {"model.lora.r": 16, "model.lora.dropout": 0.1}},
                "output": str(tmp_path / "runs"),
            }
        )
    )
    runs = expand_sweep(load_sweep(path))
    for run in runs:
        verify_run(run)  # the fast expansion equals compose() of the run's overrides
    lora = {r.label: r.config["model"]["lora"] for r in runs}
    assert (lora["narrow alpha=32 seed=0"]["r"], lora["narrow alpha=32 seed=0"]["alpha"]) == (2, 32.0)
    assert lora["wide alpha=8 seed=0"] == {"r": 16, "alpha": 8.0, "dropout": 0.1, "target_modules": TARGETS}
    ranks = tmp_path / "ranks.yaml"
    ranks.write_text(
        yaml.safe_dump(
            {"name": "ranks", "base": {"model": "builtin"}, "grid": {"model.lora": [None, {"r": 4}, {"r": 8}]}}
        )
    )
    assert [r.config["model"]["lora"] and r.config["model"]["lora"]["r"] for r in expand_sweep(load_sweep(ranks))] == [
        None,
        4,
        8,
    ]
