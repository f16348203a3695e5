"""stare_lab/trl_internals.py is the one module that reaches into TRL's private code: each place it does
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

from stare_lab import trl_internals
from stare_lab.trl_internals import REACHES, TRL_VERSION, resolve, source_hash

PACKAGE = Path(__file__).resolve().parents[1] / "stare_lab"


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
    assert doc_rows == set(range(1, 13))
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
NOT_TRL = {"vllm_engine.py: ops._supports_onednn"}


def test_no_other_module_replaces_a_method_of_trl_or_torch_at_run_time():
    """Outside trl_internals no module of the trainer's layer (trainer, loss, statistics, vLLM engine)
    assigns an attribute of another object, nor calls setattr on one."""
    modules = ["trainer.py", "trl_loss.py", "objective.py", "token_weights.py", "distributed.py", "vllm_engine.py"]
    modules += [f"signals/{p.name}" for p in (PACKAGE / "signals").glob("*.py")]
    found = []
    for name in modules:
        tree = ast.parse((PACKAGE / name).read_text())
        for line, text in _assigned_attributes(tree):
            if not OWN.match(text) and f"{name}: {text}" not in NOT_TRL:
                found.append(f"{name}:{line}: {text}")
    assert found == [], found
