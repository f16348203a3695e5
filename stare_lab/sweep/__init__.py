"""Sweeps: schema, expansion, run records, launching (submitit), status and Optuna search."""
