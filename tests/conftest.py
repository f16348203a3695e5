"""Shared test settings (no network, quiet libraries, deterministic threads) and the shared fixtures.

The folders mirror the package (each on sys.path through pyproject's `pythonpath`, so a test module
imports the helpers, and another test module, by its bare name; basenames stay unique):

- tests/ (top level): the package as a whole: its layers, no import cycle, docs that stay inside, the wheel.
- tests/methods/: the rules (stare_lab/methods): each against its references, invariants, rules kept outside.
- tests/signals/: per-token statistics (stare_lab/signals) and where a rule's statistics come from.
- tests/training/: the trainer, the loss and TRL parity, micro-batches, distributed training, kept batches.
- tests/run/: one run: the command line, config, inputs, record, tracking, evaluation, the demo end to end.
- tests/tasks/: the tasks and the built-in model (stare_lab/tasks, stare_lab/models).
- tests/sweep/: sweeps (stare_lab/sweep): launchers, queue, search, liveness, reliability, threads.
- tests/multinode/: runs over several processes and Slurm nodes (the slurm/multinode marks skip without a cluster).
- tests/viewer/: the token page, kept batches on the command line, selection figures, W&B export.
- tests/analysis/: tables, comparisons and plots over run folders (stare_lab/analysis).
- tests/dashboard/: the sweep's W&B dashboard (stare_lab/dashboard).
- tests/support/: helper modules shared by the tests and the processes they start (no tests), and
  tests/support/official_field/ (official code of the field rules, ported for comparison).
- tests/vllm_tests/: the vLLM tests, run by .venv-vllm; tests/trl_vendor/: TRL's own GRPO tests on our trainer.

The fixtures build what a trainer test needs from tests/support/fixtures_trainer.py (read it for the values):

- `tiny_lm`: (tokenizer, tiny random Qwen2), built once per test module; copy the model before training it.
- `tiny_arithmetic`: (tokenizer, `tiny_lm`'s model, a 64-problem arithmetic task, 16 held out).
- `builtin_lm`: (tokenizer, the shipped trained built-in model), once per test module.
- `smollm2_folder`: the converted SmolLM2-135M-Instruct folder (stare_lab.models.smollm2), converted at
  most once per machine, into $STARE_LAB_CACHE or the default cache where later sessions find it.
- `grpo_args(**overrides)`: GRPOConfig for a 2-step CPU run writing into the test's tmp_path.
- `make_trainer(rule, dataset, **overrides)`: TokenRuleGRPOTrainer on a copy of `tiny_lm`'s model.

Tests that need the plain functions (a worker process, a module-level helper) import fixtures_trainer.
It is imported inside the fixtures, not here, so that test files which train nothing do not load
torch and TRL at collection.
"""

from __future__ import annotations

import copy
import os

import hang_report
import pytest

hang_report.install()  # a wait on a child process that times out prints where each process was

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.pop("WANDB_API_KEY", None)


@pytest.fixture(scope="module")
def tiny_lm():
    """(tokenizer, tiny random Qwen2 seeded with 0), shared by the tests of one module."""
    import fixtures_trainer

    return fixtures_trainer.tiny_lm()


@pytest.fixture(scope="module")
def tiny_arithmetic(tiny_lm):
    """(tokenizer, tiny_lm's model, an arithmetic task of 64 training and 16 held-out problems)."""
    from stare_lab.tasks.arithmetic import ArithmeticTask

    tok, model = tiny_lm
    return tok, model, ArithmeticTask(train_size=64, heldout_size=16)


@pytest.fixture(scope="module")
def builtin_lm():
    """(tokenizer, the shipped trained built-in model), shared by the tests of one module."""
    import fixtures_trainer

    return fixtures_trainer.builtin_lm()


@pytest.fixture(scope="session")
def smollm2_folder():
    """The converted SmolLM2 folder, checked against its hashes: ~30 s of conversion the first time on
    a machine (or after make install did not run), then ~0.5 s of hashing once per session."""
    from stare_lab.models import smollm2

    return smollm2.prepared_folder()


@pytest.fixture
def grpo_args(tmp_path):
    """grpo_args(**overrides) -> GRPOConfig of the short CPU run (fixtures_trainer.SHORT_RUN) in tmp_path."""
    import fixtures_trainer

    def make(**overrides):
        return fixtures_trainer.grpo_config(tmp_path, **overrides)

    return make


@pytest.fixture
def make_trainer(tiny_lm, grpo_args):
    """make_trainer(rule, dataset, reward=length_reward, trainer_kw=None, **overrides): our trainer on a copy
    of the tiny model, with grpo_args(**overrides); trainer_kw go to TokenRuleGRPOTrainer itself."""
    import fixtures_trainer

    tok, model = tiny_lm

    def make(rule, dataset, reward=fixtures_trainer.length_reward, trainer_kw=None, **overrides):
        args = grpo_args(**overrides)
        return fixtures_trainer.rule_trainer(
            tok, copy.deepcopy(model), args, dataset, rule, reward, **(trainer_kw or {})
        )

    return make


@pytest.fixture
def in_process_env(monkeypatch):
    """This process's environment as a sweep's worker processes get it (sweep_fixtures.sweep_env: the
    tests' import path, quiet libraries), for tests that run a sweep driver in-process."""
    from sweep_fixtures import sweep_env

    for k, v in sweep_env().items():
        monkeypatch.setenv(k, v)
