"""Layer 5, one run: train, evaluate, draw and publish, in one process or across ranks.
May import layers 1-4."""
