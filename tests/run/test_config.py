"""Each config value lives once: dataclasses hold types, YAML files hold values (a comment above
each), a GPU config is a base plus its differences, every shipped YAML composes, and the
`method` group is the rule registry."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from omegaconf import MISSING, OmegaConf
from sweep_fixtures import ROOT

from stare_lab.config import run_config as config
from stare_lab.config.run_config import CONF_DIR, Config, ConfigError, compose, group_options
from stare_lab.evaluation.benchmarks import VERIFIERS
from stare_lab.launchers import LAUNCHERS
from stare_lab.methods import list_methods
from stare_lab.plan.expand import expand_sweep
from stare_lab.plan.schema import launcher_defaults, load_sweep

# config group → its schema (the task group is free-form: the task's builder checks it)
SCHEMAS = {
    "model": config.ModelConfig,
    "trainer": config.TrainerConfig,
    "logger": config.LoggerConfig,
    "eval": config.EvalConfig,
    **{f"launcher/{k}": v for k, v in LAUNCHERS.items()},  # a launcher's class is its schema
}


def _leaf_fields(schema: type, prefix: str = ""):
    for f in dataclasses.fields(schema):
        hint = config.schema_fields(schema)[f.name][0]
        if dataclasses.is_dataclass(hint):
            assert f.default is dataclasses.MISSING and f.default_factory is hint, f"{prefix}{f.name}"
            yield from _leaf_fields(hint, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f


def _own_keys(path) -> dict:
    data = yaml.safe_load(path.read_text()) or {}
    data.pop("defaults", None)
    return data


def _files(group: str):
    folder = CONF_DIR / group.split("/")[0]
    names = [group.split("/")[1]] if "/" in group else group_options(group)
    return [folder / f"{n}.yaml" for n in names]


def test_schemas_hold_types_and_no_values():
    schemas = [Config, *LAUNCHERS.values()]
    leaves = [leaf for s in schemas for leaf in _leaf_fields(s)]
    assert len(leaves) > 60
    for name, f in leaves:
        assert f.default == MISSING and f.default_factory is dataclasses.MISSING, f"{name} has a value in the schema"


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_every_field_has_exactly_one_value_source(group):
    """A base file sets every schema field; a derived file names its base in `defaults` and sets
    only fields whose value differs from the base's."""
    fields = set(config.schema_fields(SCHEMAS[group])) | ({"name"} if group.startswith("launcher/") else set())
    files = _files(group)
    bases = [p for p in files if "defaults" not in (yaml.safe_load(p.read_text()) or {})]
    assert bases, f"conf/{group}: no base file"
    for path in bases:
        assert set(_own_keys(path)) == fields, f"{path}: keys differ from the schema"
    for path in set(files) - set(bases):
        defaults = yaml.safe_load(path.read_text())["defaults"]
        base = CONF_DIR / path.parent.name / f"{defaults[0]}.yaml"
        assert defaults == [defaults[0], "_self_"] and base in bases, f"{path}: defaults {defaults}"
        own, inherited = _own_keys(path), _own_keys(base)
        assert own and set(own) <= fields, path
        copies = sorted(k for k, v in own.items() if inherited[k] == v)
        assert not copies, f"{path} repeats its base's values for {copies}"


def _task_name(path) -> str:
    """The task a task file configures: its own `name`, else its base's (a file that names a base in
    `defaults`, as task=chain_sum names reasoning_gym, is that task with some values set)."""
    data = yaml.safe_load(path.read_text())
    if "defaults" not in data:
        return data["name"]
    assert data["defaults"][-1] == "_self_" and len(data["defaults"]) == 2, f"{path}: defaults {data['defaults']}"
    return _task_name(path.parent / f"{data['defaults'][0]}.yaml")


def test_task_files_set_only_keys_their_task_schema_knows():
    for path in sorted((CONF_DIR / "task").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        name = _task_name(path)
        fields = config.schema_fields(config.TASK_SCHEMAS[name])
        assert set(data) - {"defaults"} <= set(fields), path
        if "defaults" in data:  # a derived task: only the values that differ from its base's
            base = yaml.safe_load((path.parent / f"{data['defaults'][0]}.yaml").read_text())
            copies = sorted(k for k in data if k != "defaults" and base.get(k) == data[k])
            assert "name" not in data and not copies, f"{path} repeats its base's values for {copies}"
        else:
            assert name == path.stem, path


def test_root_config_sets_seed_and_run_block_once():
    root = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    assert set(root) - {"defaults"} == {"seed", "run"}
    assert set(root["run"]) == set(config.schema_fields(config.RunConfig))
    groups = [next(iter(d)) for d in root["defaults"] if isinstance(d, dict)]
    assert groups == ["model", "task", "method", "trainer", "logger", "eval"]


def test_gpu_configs_are_the_base_plus_differences():
    gpu = _own_keys(CONF_DIR / "trainer" / "gpu_stare.yaml")
    assert yaml.safe_load((CONF_DIR / "trainer" / "gpu_stare.yaml").read_text())["defaults"] == ["cpu_small", "_self_"]
    assert len(gpu) < len(config.schema_fields(config.TrainerConfig)) / 2
    cfg = compose(["trainer=gpu_stare", "model=qwen2_5_math_7b"])
    base = compose([])
    assert cfg.trainer.max_steps == 500 and cfg.trainer.bf16 is True and cfg.model.dtype == "bfloat16"
    assert cfg.trainer.epsilon_high == base.trainer.epsilon_high == 0.28  # inherited, written once
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-Math-7B" and cfg.model.lora is None


YAML_WITH_SCHEMA = [
    p for g in ("model", "trainer", "logger", "eval", "launcher", "task") for p in sorted((CONF_DIR / g).glob("*.yaml"))
]


@pytest.mark.parametrize(
    "path", YAML_WITH_SCHEMA + [CONF_DIR / "config.yaml"], ids=lambda p: f"{p.parent.name}/{p.stem}"
)
def test_every_value_has_a_comment_above_it(path):
    lines = path.read_text().splitlines()
    in_defaults = False
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z_]\w*):\s*(\S.*)?$", line)
        if not m:
            continue
        if m.group(2) == "defaults" and not m.group(1):
            in_defaults = True
            continue
        if not m.group(1):
            in_defaults = False
        if in_defaults or m.group(3) is None:  # list of defaults, or a block header (run:)
            continue
        assert lines[i - 1].strip().startswith("#"), f"{path}:{i + 1}: no comment above {m.group(2)!r}"


COMPOSE_CASES = [
    [f"{g}={o}"]
    + (["task.train_source=x.jsonl"] if o == "math" and g == "task" else [])
    + (["model=qwen2_5_1_5b"] if o in ("reasoning_gym", "chain_sum") and g == "task" else [])
    for g in ("model", "task", "trainer", "logger", "eval")
    for o in group_options(g)
]


@pytest.mark.parametrize("overrides", COMPOSE_CASES, ids=lambda o: o[0])
def test_every_shipped_group_option_composes(overrides):
    cfg = compose(overrides)
    group, option = overrides[0].split("=")
    assert not OmegaConf.missing_keys(cfg) and re.fullmatch(r"[0-9a-f]{12}", cfg.run.id)
    if group == "task":
        assert cfg.task.name == _task_name(CONF_DIR / "task" / f"{option}.yaml")


def test_every_launcher_and_benchmark_file_loads():
    for name, schema in LAUNCHERS.items():
        values = launcher_defaults(name)
        assert set(values) == {"name", *config.schema_fields(schema)} and values["name"] == name
        for key, (hint, rules) in config.schema_fields(schema).items():
            assert config.field_problem(values[key], hint, rules) is None, (name, key)
    for path in sorted((CONF_DIR / "benchmark").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert data["name"] == path.stem and data["verifier"] in VERIFIERS and data["n"] >= 1, path
        assert data["temperature"] >= 0 and 0 < data["top_p"] <= 1, path


def test_evaluation_settings_left_null_are_each_benchmarks_own():
    """conf/eval leaves n, temperature, top_p, max_tokens unset: MATH-500 keeps its avg@4 under eval=math."""
    for option in group_options("eval"):
        e = compose([f"eval={option}"]).eval
        if all(b.startswith("rg:") for b in e.benchmarks):
            continue  # an evaluation made for one task's held-out problems (eval=chain_sum), tested below
        assert (e.n, e.temperature, e.top_p) == (None, None, None), option
    # eval=chain_sum samples as its sweep's rollouts do, where Reasoning Gym's own is avg@4 at top-p 0.7
    rg_own = yaml.safe_load((CONF_DIR / "benchmark" / "reasoning_gym.yaml").read_text())
    e = compose(["eval=chain_sum"]).eval
    assert (e.n, e.temperature, e.top_p, e.max_tokens) == (8, 1.0, 1.0, 48)
    assert (rg_own["n"], rg_own["top_p"]) == (4, 0.7)
    bench = {p.stem: yaml.safe_load(p.read_text()) for p in (CONF_DIR / "benchmark").glob("*.yaml")}
    assert (bench["math500"]["n"], bench["aime24"]["n"], bench["arithmetic"]["n"]) == (4, 32, 32)
    assert compose(["eval.n=8"]).eval.n == 8


def test_derived_defaults_and_run_id_come_from_one_function():
    cfg = compose([])
    assert cfg.trainer.steps_per_generation == cfg.trainer.gradient_accumulation_steps == 2
    assert compose(["trainer.steps_per_generation=4"]).trainer.steps_per_generation == 4
    plain = OmegaConf.to_container(compose([]))
    plain["run"]["id"], plain["trainer"]["steps_per_generation"] = None, None
    assert config.finalize(plain)["run"]["id"] == cfg.run.id and plain["trainer"]["steps_per_generation"] == 2
    assert config.run_id(cfg) == cfg.run.id


def test_method_group_is_the_registry():
    assert not (CONF_DIR / "method").exists()
    # the registry's rules, and `base` (the untrained model: stare_lab.core.controls, not a rule)
    assert group_options("method") == sorted([*list_methods(), "base"])
    assert "base" not in list_methods()
    for name in list_methods():
        assert compose([f"method={name}"]).method.name == name
    with pytest.raises(ConfigError) as e:
        compose(["method=nope"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("unknown method option 'nope'; valid: ")
    valid, hint = msg.split("valid: ")[1].split("; ")
    assert valid.split(", ") == sorted([*list_methods(), "base"])
    assert "--import MODULE" in hint and "imports:" in hint and "stare_lab.rules" in hint


# ----------------------------------------------------------------- a rule from a module of its own
@dataclass(frozen=True)
class ThrowawayParams:
    rho: float = 0.5


THROWAWAY = "throwaway_rule"


@pytest.fixture
def throwaway_rule():
    from hydra.core.config_store import ConfigStore

    from stare_lab.methods import RuleOutput, register, registry

    @register(THROWAWAY, ThrowawayParams)
    def throwaway(stats, state, p):
        return RuleOutput(weights=stats.mask.float() * p.rho, normalize="valid")

    yield THROWAWAY
    registry._REGISTRY.pop(THROWAWAY, None)
    ConfigStore.instance().repo.get("method", {}).pop(f"{THROWAWAY}.yaml", None)


def test_a_new_rule_reaches_configs_and_the_demo_sweep_by_itself(throwaway_rule, tmp_path):
    assert throwaway_rule in list_methods()
    cfg = compose([f"method={throwaway_rule}", "method.params.rho=0.25"])
    assert cfg.method.name == throwaway_rule and cfg.method.params == {"rho": 0.25}
    spec = load_sweep(ROOT / "sweeps" / "demo.yaml", output=tmp_path)
    assert spec.grid["method"] == list_methods()  # registration order
    runs = expand_sweep(spec)
    mine = [r for r in runs if r.config["method"]["name"] == throwaway_rule]
    assert [r.label for r in mine] == [f"{throwaway_rule} seed=0", f"{throwaway_rule} seed=1"]
    assert mine[0].config["method"]["params"] == {"rho": 0.5}
    assert len(runs) == 2 * (len(list_methods()) + len(spec.controls))  # every rule and each control, 2 seeds


def test_the_throwaway_rule_is_gone_afterwards():
    assert THROWAWAY not in list_methods() and THROWAWAY not in group_options("method")


def test_sweeps_are_found_by_path_or_by_packaged_name(tmp_path, monkeypatch):
    from stare_lab.config.run_config import PACKAGE_DIR, SWEEP_DIR, sweep_path
    from stare_lab.plan.schema import SweepError

    assert CONF_DIR == PACKAGE_DIR / "conf" and SWEEP_DIR == PACKAGE_DIR / "sweeps"
    assert (ROOT / "conf").resolve() == CONF_DIR and (ROOT / "sweeps").resolve() == SWEEP_DIR  # documented layout
    monkeypatch.chdir(tmp_path)
    assert sweep_path("demo") == SWEEP_DIR / "demo.yaml"
    assert load_sweep("demo").path == SWEEP_DIR / "demo.yaml"
    (tmp_path / "demo").mkdir()  # a path that exists wins over the name
    assert sweep_path("demo") == Path("demo")
    assert sweep_path("sweeps/demo.yaml") == Path("sweeps/demo.yaml")
    with pytest.raises(
        SweepError, match=r"^nope: no such sweep file \(or packaged sweep name: anchor_explorer, .*demo,"
    ):
        load_sweep("nope")


def test_the_scheduler_choices_are_transformers_own():
    from transformers.trainer_utils import SchedulerType

    from stare_lab.config.schema import LR_SCHEDULERS

    needs_eval = {"reduce_lr_on_plateau", "greedy"}  # the GRPO trainer runs no evaluation strategy
    assert set(LR_SCHEDULERS) == {s.value for s in SchedulerType} - needs_eval


def test_all_in_a_grid_means_every_option_of_the_group(tmp_path):
    from sweep_fixtures import write_sweep

    spec = load_sweep(write_sweep(tmp_path, grid={"trainer": "all", "method": "all"}))
    assert spec.grid == {"trainer": ["cpu_small", "cpu_smollm2", "gpu_stare"], "method": list_methods()}
