"""A rule's parameters are checked against the types its `Params` declares, for every rule
(stare_lab.methods.param_types), before the rule's own checks: one line naming the parameter, the
type expected and the value given, from `get_method`, `train` and a sweep's `--dry-run`.

The registry's answer for every field of every registered rule and a grid of values is compared with
`reference`, a plain table of what each declared type accepts (the module docstring's rules).
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Optional, Union

import pytest
import yaml

from stare_lab.cli import main
from stare_lab.config.run_config import compose
from stare_lab.methods import get_method, list_methods, method_params
from stare_lab.methods.param_types import conform_params, describe, given

SUPPORT = Path(__file__).resolve().parents[1] / "support"  # rule_plugin_example
VALUES = [
    0,
    1,
    -3,
    2.0,
    0.5,
    math.inf,
    True,
    False,
    "abc",
    "0.5",
    "inf",
    "-inf",
    None,
    [1, 2],
    (3,),
    [1.5],
    {},
    {"a": 1},
]
INFINITY = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf, "-infinity": -math.inf}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def reference(value: Any, hint: Any) -> tuple[bool, Any]:
    """(accepted, kept value) by the documented table, one declared type at a time."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    if value is None:
        return type(None) in members, None
    exact = {
        float: lambda v: isinstance(v, float),
        int: _is_int,
        bool: lambda v: isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }
    for m in members:  # an exact match first
        if m in exact and exact[m](value):
            return True, value
        if typing.get_origin(m) is tuple and isinstance(value, (list, tuple)) and all(_is_int(x) for x in value):
            return True, value
        if typing.get_origin(m) is dict and isinstance(value, dict):
            return True, value
    if float in members and _is_int(value):
        return True, float(value)
    if float in members and isinstance(value, str) and value.lower() in INFINITY:
        return True, INFINITY[value.lower()]
    return False, value


def _fields() -> list[tuple[str, str, Any]]:
    out = []
    for name in list_methods():
        hints = typing.get_type_hints(method_params(name))
        out += [(name, f.name, hints[f.name]) for f in dataclasses.fields(method_params(name))]
    return out


def test_every_registered_rule_declares_types_the_registry_reads():
    fields = _fields()
    assert len({name for name, _, _ in fields}) == len(list_methods()) >= 21
    for name, field, hint in fields:
        default = getattr(method_params(name)(), field)
        assert reference(default, hint)[0], f"{name}.{field}: its default {default!r} is not a {hint}"
        assert describe(hint) and "typing" not in describe(hint), (name, field, describe(hint))


@pytest.mark.parametrize("name", list_methods())
def test_each_value_against_the_declared_type_of_every_parameter(name):
    hints = typing.get_type_hints(method_params(name))
    for field, hint in hints.items():
        for value in VALUES:
            accepted, kept = reference(value, hint)
            try:
                rule = get_method(name, **{field: value})
            except ValueError as e:
                msg = str(e)
                assert "\n" not in msg and "not supported between" not in msg, msg
                typed = msg.startswith(f"rule {name!r}: parameter {field!r} (method.params.{field}) expects ")
                assert typed == (not accepted), (field, value, msg)
                if typed:
                    assert msg.split(" expects ")[1].startswith(describe(hint) + ", got " + given(value)), msg
                continue
            assert accepted, (field, value, "accepted but the declared type refuses it")
            got = getattr(rule.params, field)
            if kept is None:  # null = the rule's own choice, which its __post_init__ may fill in (GMTS's normalize)
                continue
            # a rule may normalise a value in its own __post_init__ (a list of layers to a tuple)
            assert got == kept or (isinstance(kept, list) and tuple(kept) == got), (field, value, got)
            assert type(got) is type(kept) or isinstance(kept, (list, tuple)), (field, value, type(got))


def test_hand_cases():
    with pytest.raises(ValueError) as e:
        get_method("clip_cov", ratio="abc")
    assert (
        str(e.value)
        == "rule 'clip_cov': parameter 'ratio' (method.params.ratio) expects a number, got 'abc' (a string)"
    )
    with pytest.raises(ValueError, match=r"expects a number, got '0.5' \(a string\); write the number without quotes"):
        get_method("clip_cov", ratio="0.5")
    assert type(get_method("clip_cov", ratio=1).params.ratio) is float  # int → float
    with pytest.raises(ValueError, match=r"parameter 'adaptive' .* expects true or false, got 1 \(an integer\)"):
        get_method("stare", adaptive=1)  # an int is not a bool
    with pytest.raises(ValueError, match=r"parameter 'warmup_steps' .* expects an integer, got True \(a boolean\)"):
        get_method("ict", warmup_steps=True)  # nor a bool an int
    with pytest.raises(ValueError, match=r"expects an integer, got 2.0 \(a float\)"):
        get_method("ict", warmup_steps=2.0)
    with pytest.raises(ValueError, match=r"parameter 'scope' .* expects a string, got 5 \(an integer\)"):
        get_method("clip_cov", scope=5)
    assert get_method("rsi_band", high="inf").params.high == math.inf  # what a record writes for ∞
    with pytest.raises(ValueError, match=r"parameter 'layers' .* expects an integer, a list of integers or null"):
        get_method("anchor", layers=[1, "x"])
    # the same run whether a float parameter is written 1 or 1.0 (as for the trainer's float keys)
    assert (
        compose(["method=stare", "method.params.W=1"]).run.id == compose(["method=stare", "method.params.W=1.0"]).run.id
    )


def test_literal_optional_and_unions_of_a_rule_of_ones_own():
    @dataclasses.dataclass(frozen=True)
    class P:
        mode: Literal["a", "b"] = "a"
        k: Optional[int] = None  # noqa: UP045 - the typing spelling, as a plugin may write it
        x: int | float = 1
        names: tuple[str, ...] = ()

    assert conform_params("mine", P, {"mode": "b", "k": None, "x": 2, "names": ["u"]}) == {
        "mode": "b",
        "k": None,
        "x": 2,  # an exact int member: kept an int
        "names": ["u"],
    }
    for params, words in [
        ({"mode": "c"}, "parameter 'mode' (method.params.mode) expects one of 'a', 'b', got 'c' (a string)"),
        ({"k": 1.0}, "parameter 'k' (method.params.k) expects an integer or null, got 1.0 (a float)"),
        ({"x": "1"}, "parameter 'x' (method.params.x) expects an integer or a number, got '1' (a string); write"),
        ({"names": [1]}, "parameter 'names' (method.params.names) expects a list of strings, got [1] (a list)"),
    ]:
        with pytest.raises(ValueError) as e:
            conform_params("mine", P, params)
        assert str(e.value).startswith("rule 'mine': " + words), str(e.value)


def test_train_refuses_a_mistyped_parameter_in_one_line(tmp_path, capsys):
    assert main(["train", "method=clip_cov", "method.params.ratio=abc", f"run.root={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "stare-lab: error: rule 'clip_cov': parameter 'ratio' (method.params.ratio) expects a number, "
        "got 'abc' (a string)"
    )
    assert not any(tmp_path.iterdir())


def test_a_sweeps_dry_run_refuses_a_plugins_mistyped_parameter(tmp_path):
    """tests/support/rule_plugin_example.py's `normalize: 5` (found on PYTHONPATH) and a grid axis of clip_cov."""
    sweep = {
        "name": "typed",
        "imports": ["rule_plugin_example"],
        "base": {"method": "plugin_example", "overrides": {"method.params.normalize": 5}},
        "output": str(tmp_path / "runs"),
    }
    (tmp_path / "typed.yaml").write_text(yaml.safe_dump(sweep))
    sweep2 = {"name": "typed2", "base": {"method": "clip_cov"}, "grid": {"method.params.ratio": [0.1, "abc"]}}
    (tmp_path / "typed2.yaml").write_text(yaml.safe_dump({**sweep2, "output": str(tmp_path / "runs")}))
    env = {"PYTHONPATH": str(SUPPORT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    lines = []
    for name in ("typed", "typed2"):
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "stare-lab"), "sweep", "run", f"{name}.yaml", "--dry-run"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        lines.append(proc.stderr.strip())
    assert lines == [
        "stare-lab: error: typed.yaml: base.overrides.method.params.normalize: rule 'plugin_example': "
        "parameter 'normalize' (method.params.normalize) expects a string, got 5 (an integer) (run 'seed=0')",
        "stare-lab: error: typed2.yaml: grid.method.params.ratio[1]: rule 'clip_cov': parameter "
        "'ratio' (method.params.ratio) expects a number, got 'abc' (a string) (run 'ratio=abc seed=0')",
    ]
    assert not (tmp_path / "runs").exists()
