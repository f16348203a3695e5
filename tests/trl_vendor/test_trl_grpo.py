"""TRL's own GRPO trainer tests, run against TokenRuleGRPOTrainer with rule `full` (docs/trl_parity.md).

The suite is TRL's `tests/test_grpo_trainer.py` for the installed TRL, read from a checkout
(upstream.py, ORIGIN.md) and left unedited; its test classes are collected here with two
substitutions in their module: `GRPOTrainer` (ours, rule `full`) and `load_dataset` (stand-ins).
Hub model ids resolve to the stand-ins that conftest.py saves in a temporary hub cache.
Without a checkout the module is skipped with the reason.
"""
import os

import pytest
import upstream

_folder = upstream.tests_dir()
_reason = upstream.why_not_runnable(_folder)
if _reason:
    pytest.skip(_reason, allow_module_level=True)

_suite, _conftest = upstream.load(_folder)
upstream.substitute(_suite, os.environ.get("STARE_TRL_PARITY_TRAINER", "ours"))

globals().update({name: getattr(_suite, name) for name in dir(_suite) if name.startswith("Test")})
if _conftest is not None:  # TRL's autouse fixtures (CPU forcing, clean-up) apply to its tests here too
    globals().update({name: getattr(_conftest, name) for name in dir(_conftest)
                      if hasattr(getattr(_conftest, name), "_fixture_function_marker")
                      or type(getattr(_conftest, name)).__name__ == "FixtureFunctionDefinition"})
