"""Every registered rule (list_methods(), so a newly registered rule is covered without editing
this file) with its default parameters satisfies the invariants of tests/support/rule_invariants.py."""

from __future__ import annotations

import pytest
import rule_invariants as inv
import torch

from stare_lab.methods import get_method, list_methods
from stare_lab.stats import STATISTICS


@pytest.mark.parametrize("check", inv.CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("name", list_methods())
def test_invariant(name, check):
    check(get_method(name))


def test_factory_builds_every_statistic_of_the_table():
    """A statistic added to the table must be added to the factory (else no rule reading it is tested)."""
    stats = inv.rule_batches.make_stats(0, 4, 3)
    assert all(getattr(stats, name) is not None for name in STATISTICS)


def test_the_suite_catches_a_broken_rule():
    """The invariants can fail: a rule that reads an undeclared statistic, or weights padding."""
    from stare_lab.methods.full import Params
    from stare_lab.methods.registry import Rule, RuleOutput, _Entry

    def reads_undeclared_logp(stats, state, p):
        return RuleOutput(weights=stats.mask * stats.logp.exp(), normalize="valid")

    def weights_padding(stats, state, p):
        return RuleOutput(weights=stats.mask * 0 + 1, normalize="valid", selected=stats.mask >= 0)

    bad_logp = Rule(_Entry("bad_logp", Params, reads_undeclared_logp, frozenset(), None), Params())
    with pytest.raises(AssertionError):
        inv.check_finite(bad_logp)
    bad_pad = Rule(_Entry("bad_pad", Params, weights_padding, frozenset(), None), Params())
    with pytest.raises(AssertionError):
        inv.check_declared_normalisation(bad_pad)  # `selected` outside the valid tokens

    def writes_through_a_copy(stats, state, p):
        """The bug of issue 27.3's family: `zeros_like` keeps the input's strides, then `reshape(-1)` of a
        non-contiguous tensor is a copy, so the writes are lost (`view(-1)` would raise instead)."""
        out = torch.zeros_like(stats.mask)
        out.reshape(-1)[:5] = 1.0
        return RuleOutput(weights=out * stats.mask, normalize="valid")

    bad_strides = Rule(_Entry("bad_strides", Params, writes_through_a_copy, frozenset(), None), Params())
    inv.check_finite(bad_strides)  # a fine rule on contiguous inputs
    with pytest.raises(AssertionError):
        inv.check_any_strides(bad_strides)
