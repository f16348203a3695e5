"""stare_lab/training/trl_internals.py is the one module that reaches into TRL's private code: each place it does
is in its inventory (`REACHES`) with the source hash of the TRL function it was read from, and this test
fails when TRL (or transformers, for the checkpoint override) changes any of them. No other module of
stare_lab replaces a method or attribute of a live object."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import transformers
import trl
from trl import GRPOTrainer

from stare_lab.training import trl_internals
from stare_lab.training.trl_internals import REACHES, TRL_VERSION, resolve, source_hash

PACKAGE = Path(__file__).resolve().parents[2] / "stare_lab"
# The modules of the training layer besides trl_internals: the trainer, the loss, the statistics, the engine.
TRAINER_LAYER = [
    "training/trainer.py",
    "training/trl_loss.py",
    "training/objective.py",
    "training/token_weights.py",
    "training/vllm_engine.py",
    *sorted(f"signals/{p.name}" for p in (PACKAGE / "signals").glob("*.py")),
]


def test_the_installed_versions_are_those_the_inventory_was_read_from():
    assert trl.__version__ == TRL_VERSION
    assert transformers.__version__ == trl_internals.TRANSFORMERS_VERSION


@pytest.mark.parametrize("reach", REACHES, ids=lambda r: f"{r.number}-{r.read_from}")
def test_each_reach_reads_the_source_it_was_written_against(reach):
    fn = resolve(reach.read_from)
    assert source_hash(fn) == reach.source_hash, f"{reach.read_from} changed: re-read reach {reach.number}"
    source = inspect.getsource(fn)
    for name in reach.names:
        assert name in source, f"{reach.read_from} no longer contains {name!r} (reach {reach.number})"


def test_every_row_of_the_table_has_a_checked_reach():
    doc_rows = {int(m) for m in re.findall(r"^\s?(\d{1,2})  ", trl_internals.__doc__ or "", re.M)}
    assert doc_rows == set(range(1, 15))
    assert {r.number for r in REACHES} == doc_rows


def test_the_hash_tells_a_changed_source():
    assert source_hash(resolve("trl:GRPOTrainer._compute_loss")) != source_hash(
        resolve("trl:GRPOTrainer.get_high_entropy_mask")
    )


def _assigned_attributes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of each `setattr(...)`/`delattr(...)` call and each assignment to an attribute of an
    object other than `self` (`x.y = ...`)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            out.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            for t in flat:
                if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                    out.append((node.lineno, ast.unparse(t)))
    return out


# Attribute assignments outside trl_internals to stare_lab's own objects (the recorder's parts, the rule state).
OWN = re.compile(r"^(self\.ae|self\.rule_state|rec)\.")
# vLLM's (not TRL's) CPU flag, set once before an engine is built, never restored (vllm_engine.py, docs/vllm.md).
NOT_TRL = {"training/vllm_engine.py: ops._supports_onednn"}


def test_no_other_module_replaces_a_method_of_trl_or_torch_at_run_time():
    """Outside trl_internals no module of the trainer's layer (trainer, loss, statistics, vLLM engine)
    assigns an attribute of another object, nor calls setattr on one."""
    found = []
    for name in TRAINER_LAYER:
        tree = ast.parse((PACKAGE / name).read_text())
        for line, text in _assigned_attributes(tree):
            if not OWN.match(text) and f"{name}: {text}" not in NOT_TRL:
                found.append(f"{name}:{line}: {text}")
    assert found == [], found


def _trl_private_names() -> set[str]:
    """Private methods and attributes of GRPOTrainer and the transformers Trainer it extends."""
    names = {n for n in dir(GRPOTrainer) if n.startswith("_") and not n.startswith("__")}
    for cls in GRPOTrainer.__mro__:
        if cls.__module__.startswith(("trl", "transformers")):
            names |= set(re.findall(r"self\.(_[a-z]\w*)", inspect.getsource(cls)))
    return names


def test_no_other_module_names_a_private_method_or_attribute_of_trl():
    """The trainer layer reaches TRL's private code only through trl_internals: no attribute access
    `x._name` where `_name` is private to TRL's (or transformers') trainer, outside that module."""
    private = _trl_private_names()
    assert {"_compute_loss", "_metrics", "_step", "_generate_single_turn"} <= private
    found = []
    for name in TRAINER_LAYER:
        for node in ast.walk(ast.parse((PACKAGE / name).read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{name}:{node.lineno}: .{node.attr}")
    assert found == [], found
