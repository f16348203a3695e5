"""Explicit imports of every rule module (each registers itself on import)."""
# ruff: noqa: F401
from stare_lab.methods import (
    anchor,
    attn_soft,
    explorer,
    full,
    gmts,
    ict,
    low_entropy,
    opefo,
    random_subset,
    rsi_band,
    stapo,
    stare,
    top_entropy,
)
