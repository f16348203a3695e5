"""Token rules: one file per rule, a registry, and shared selection helpers.

    from stare_lab.methods import get_method, list_methods, RuleState
    rule = get_method("rsi_band", low=0.5, high=2.0)
    out = rule(stats, RuleState(step=0, total_steps=100))
"""
from stare_lab.methods.registry import (
    Rule,
    RuleOutput,
    RuleState,
    get_method,
    list_methods,
    method_params,
    register,
)

__all__ = ["Rule", "RuleOutput", "RuleState", "get_method", "list_methods", "method_params", "register"]
