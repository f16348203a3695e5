"""Layer 6, sweeps: the driver's launch, its queue workers, Optuna search, the vLLM server task, progress.
May import layers 1-5."""
