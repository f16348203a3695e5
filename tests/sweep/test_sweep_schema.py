"""Sweep files: malformed ones fail with one line and launch nothing; expansion equals compose()."""

from __future__ import annotations

import itertools

import pytest
import yaml
from sweep_fixtures import ROOT, write_sweep

from stare_lab.cli.sweep import main
from stare_lab.plan.expand import expand_sweep, fmt_value, verify_run
from stare_lab.plan.schema import load_sweep

SHIPPED = sorted((ROOT / "sweeps").glob("*.yaml"))

BASE = "name: bad\nbase: {model: builtin, logger: none}\nseeds: [0]\n"
# (case, file text with OUT for the output folder, expected key path in the error, expected words)
MALFORMED = [
    ("unknown top-level key", BASE + "gird: {method: [full]}\n", "unknown key 'gird'", "valid keys: name"),
    ("unknown rule", BASE + "grid: {method: [full, nope]}\n", "grid.method[1]", "valid: adv_reweight, anchor"),
    (
        "wrong value type",
        BASE.replace("logger: none}", "logger: none, overrides: {trainer.max_steps: abc}}"),
        "base.overrides.trainer.max_steps",
        "abc",
    ),
    ("empty grid axis", BASE + "grid: {method: []}\n", "grid.method", "empty list"),
    ("empty grid", BASE + "grid: {}\n", "grid", "non-empty mapping"),
    (
        "unknown config key",
        BASE.replace("logger: none}", "logger: none, overrides: {trainer.max_stepz: 3}}"),
        "base.overrides.trainer.max_stepz",
        "valid keys under trainer",
    ),
    (
        "malformed override key",
        BASE.replace("logger: none}", "logger: none, overrides: {'trainer..lr': 1}}"),
        "base.overrides.trainer..lr",
        "not a config key",
    ),
    ("missing base", "name: bad\nseeds: [0]\n", "missing required key 'base'", "base"),
    (
        "missing base config option",
        "name: bad\nbase: {model: builtin, trainer: gpu_huge}\n",
        "base.trainer",
        "valid: cpu_small",
    ),
    ("unwritable output folder", BASE + "output: OUT/a_file/runs\n", "output", "a_file"),
    (
        "duplicate variant names",
        BASE + "variants:\n  a: {method: anchor}\n  a: {method: explorer}\n",
        "duplicate key 'a'",
        "line",
    ),
    (
        "duplicate variant bundles",
        BASE + "variants:\n  a: {method: anchor}\n  b: {method: anchor}\n",
        "variants.b",
        "same overrides as variants.a",
    ),
    (
        "unknown rule parameter",
        BASE + "variants:\n  lo: {method: rsi_band, method.params.rho: 0.1}\n",
        "variants.lo.method.params.rho",
        "valid parameters: low, high",
    ),
    ("bad seeds", BASE.replace("seeds: [0]", "seeds: [0, one]"), "seeds[1]", "integer"),
    ("unknown launcher", BASE + "launcher: {name: kubernetes}\n", "launcher.name", "valid: local, slurm"),
    ("unknown launcher key", BASE + "launcher: {name: slurm, gpu: 1}\n", "launcher.gpu", "gpus_per_node"),
    (
        "grid and variant set one key",
        BASE + "grid: {method: [full]}\nvariants: {a: {method: anchor}}\n",
        "variants.a.method",
        "also set by the grid",
    ),
    (
        "bad search metric",
        BASE + "search: {params: {method.params.rho: {low: 0.1, high: 0.3}}, "
        "objective: {metric: accuracy}, trials: 2}\n",
        "search.objective.metric",
        "eval/<benchmark>/<metric>",
    ),
    ("invalid YAML", BASE + "grid: {method: [full\n", "invalid YAML", "line"),
    ("bad rule value", BASE + "variants: {s: {method: stare, method.params.variant: O3}}\n", "variants.s", "O3"),
]


@pytest.mark.parametrize("case,text,where,words", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_sweep_is_one_line_exit_2_and_launches_nothing(tmp_path, capsys, case, text, where, words):
    (tmp_path / "a_file").write_text("a file, not a folder")
    if "output:" not in text:
        text += f"output: {tmp_path / 'runs'}\n"
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("OUT", str(tmp_path)))
    assert main(["sweep", "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    assert str(path) in err and where in err and words in err, err
    assert not (tmp_path / "runs").exists()  # nothing launched, no folder written


def test_dry_run_prints_the_expanded_runs_and_writes_nothing(tmp_path, capsys):
    path = write_sweep(
        tmp_path,
        grid={"method": ["full", "top_entropy"], "method.params.normalize": ["valid", "selected"]},
        seeds=[0, 1],
    )
    assert main(["sweep", "run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "8 runs" in out and out.count("top_entropy normalize=valid seed=1") == 1
    assert not (tmp_path / "runs").exists()


def test_expansion_is_the_grid_product_times_variants_times_seeds(tmp_path):
    path = write_sweep(
        tmp_path,
        grid={"method.params.normalize": ["valid", "selected"], "trainer.learning_rate": [1, 0.01]},
        variants={"a": {"method": "anchor"}, "e": {"method": "explorer", "method.params.rho": 0.1}},
        seeds=3,
    )
    spec = load_sweep(path)
    runs = expand_sweep(spec)
    assert len(runs) == 2 * 2 * 2 * 3
    assert len({r.id for r in runs}) == len(runs)
    assert runs == expand_sweep(load_sweep(path))  # pure and stable
    combos = {
        (
            r.config["method"]["name"],
            r.config["method"]["params"]["normalize"],
            r.config["trainer"]["learning_rate"],
            r.seed,
        )
        for r in runs
    }
    assert combos == set(itertools.product(["anchor", "explorer"], ["valid", "selected"], [1.0, 0.01], [0, 1, 2]))
    r = next(r for r in runs if r.variant == "e")
    assert r.config["method"]["params"]["rho"] == 0.1 and r.config["trainer"]["max_steps"] == 2
    assert r.label.startswith("e normalize=") and r.run_dir == spec.folder / r.id
    assert r.config["run"] == {
        "root": str(spec.output),
        "sweep": spec.name,
        "id": r.id,
        "label": r.label,
        "variant": "e",
        "processes": 1,
    }
    assert isinstance(r.config["trainer"]["learning_rate"], float)  # 1 → 1.0, as the schema stores it
    for run in runs[::5]:
        verify_run(run)  # fast path == stare_lab.config.run_config.compose


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_sweep_expands_and_matches_compose(path, tmp_path):
    spec = load_sweep(path, output=tmp_path)
    if spec.search is not None:
        from stare_lab.plan.expand import Composer
        from stare_lab.sweep.search import distributions, trial_run

        sample = {k: (d.choices[0] if hasattr(d, "choices") else d.low) for k, d in distributions(spec.search).items()}
        verify_run(trial_run(Composer(spec), spec, 0, sample))
        return
    runs = expand_sweep(spec)
    assert len({r.id for r in runs}) == len(runs) > 1
    methods = {}
    for r in runs:
        methods.setdefault((r.variant, r.config["method"]["name"]), r)
    for r in methods.values():  # one run per arm, checked against Hydra
        verify_run(r)


def test_demo_covers_every_rule():
    from stare_lab.methods import list_methods

    spec = load_sweep(ROOT / "sweeps" / "demo.yaml")
    assert set(spec.grid["method"]) == set(list_methods()) and len(spec.seeds) == 2
    assert spec.launcher.name == "local"


def test_override_values_round_trip_through_hydra_syntax():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for v in [
        1,
        1.5,
        1e-06,
        float("inf"),
        True,
        None,
        "abc",
        "a b",
        "1e-6",
        "null",
        "it's",
        "Qwen/Qwen2.5-1.5B",
        [1, "x"],
    ]:
        parsed = parser.parse_override(f"k={fmt_value(v)}").value()
        assert parsed == v and type(parsed) is type(v), (v, fmt_value(v), parsed)


def test_cli_options_override_the_launcher(tmp_path):
    path = write_sweep(tmp_path, launcher={"name": "local", "workers": 3})
    spec = load_sweep(path, launcher={"name": "slurm", "partition": "gpu", "gpus_per_node": 2, "timeout_min": 30})
    assert spec.launcher.name == "slurm" and spec.launcher.partition == "gpu"
    assert spec.launcher.gpus_per_node == 2 and spec.launcher.timeout_min == 30
    assert (
        spec.launcher.array_parallelism
        == yaml.safe_load((ROOT / "conf/launcher/slurm.yaml").read_text())["array_parallelism"]
    )
    assert load_sweep(path).launcher.workers == 3


def test_the_built_in_launchers_keys_are_their_conf_files():
    # a launcher's fields type its keys (its class is the one schema); conf/launcher/<name>.yaml holds their values
    from stare_lab.launchers import LAUNCHERS, launcher_defaults
    from stare_lab.launchers.base import _fields

    assert list(LAUNCHERS) == ["local", "slurm"]
    for name, cls in LAUNCHERS.items():
        assert list(_fields(cls)) == [k for k in launcher_defaults(name) if k != "name"], name  # the file's order
