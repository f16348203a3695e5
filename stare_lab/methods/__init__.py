"""Layer 1, the token rules: one file per rule, their registry and types, the loss types, the clipped surrogate,
and rules kept outside the package. May import core and stats.

Token rules: one file per rule, a registry, and shared selection helpers.

    from stare_lab.methods import get_method, list_methods, RuleState
    rule = get_method("rsi_band", low=0.5, high=2.0)
    out = rule(stats, RuleState(step=0, total_steps=100))

Each rule module registers itself when imported. The imports below are the whole list of rules,
and their order is the registration order: `list_methods()` and `grid: {method: all}` follow it (tables:
baseline first, then alphabetical); rules kept outside the package register after these (stare_lab.methods.outside).
"""

from stare_lab.methods.registry import (
    NORMALIZE,
    LossBatch,
    LossTerms,
    Rule,
    RuleOutput,
    RuleState,
    TrainerValues,
    get_method,
    list_methods,
    method_iterations,
    method_params,
    register,
    register_loss,
)

# The order of these imports is the registration order.
# ruff: noqa: E402, F401, I001
from stare_lab.methods import full
from stare_lab.methods import random_subset
from stare_lab.methods import top_entropy
from stare_lab.methods import low_entropy
from stare_lab.methods import anchor
from stare_lab.methods import explorer
from stare_lab.methods import attn_soft
from stare_lab.methods import stare
from stare_lab.methods import rsi_band
from stare_lab.methods import ict
from stare_lab.methods import gmts
from stare_lab.methods import opefo
from stare_lab.methods import stapo
from stare_lab.methods import clip_cov
from stare_lab.methods import kl_cov
from stare_lab.methods import dppo
from stare_lab.methods import adv_reweight
from stare_lab.methods import lopti
from stare_lab.methods import archer
from stare_lab.methods import entropy_adv
from stare_lab.methods import ce_gppo

__all__ = [
    "NORMALIZE",
    "LossBatch",
    "LossTerms",
    "Rule",
    "RuleOutput",
    "RuleState",
    "TrainerValues",
    "get_method",
    "list_methods",
    "method_iterations",
    "method_params",
    "register",
    "register_loss",
]
