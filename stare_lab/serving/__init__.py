"""Layer 3, the run's vLLM server: started beside the trainer, fed its weights, watched.
May import layers 1-2."""
