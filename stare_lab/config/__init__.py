"""Layer 2, one run's configuration: the config tree and its checks, the run's inputs, where a vLLM server sits.
May import layer 1 (core, methods, record, tasks, stats) and models (the packaged models' checks, the LoRA section)."""
