"""Settings shared by the vLLM tests (tests/vllm_tests/conftest.py shares the engine)."""

# Small rollouts: 2 prompts × 4 completions per step; every trainer of the session has this batch,
# so the shared engine's max_num_seqs (TRL sets it from the first trainer) fits all of them.
SMALL = [
    "trainer.use_vllm=true",
    "trainer.vllm_gpu_memory_utilization=0.1",
    "trainer.per_device_train_batch_size=8",
    "trainer.num_generations=4",
    "trainer.gradient_accumulation_steps=1",
    "trainer.max_completion_length=20",
    "trainer.learning_rate=1e-3",
    "trainer.save_steps=100",
    "logger=none",
    "eval.enabled=false",
]
