"""The parity suite's stand-ins and markers.

- A session fixture saves the stand-in models (standins.py) in a temporary hub cache and points
  huggingface_hub at it (HF_HUB_OFFLINE is already set by tests/conftest.py).
- Collection: a TRL test naming a hub model without a stand-in is skipped with that reason;
  every TRL test is `slow` except a few quick ones (FAST), so `make test` stays short; with our
  trainer, the tests of features it refuses are expected to fail with its ValueError (REFUSED,
  strict: a refusal that stops raising shows up).
"""
from __future__ import annotations

import inspect
import os
import re

import pytest

import standins

FAST = ("TestGetHighEntropyMask::", "test_train_dataset_format[standard_prompt_only]",
        "test_train_loss_types[sapo-False]", "test_train_with_static_entropy")
# test name (substring) → the refusal's reason (docs/trl_parity.md)
REFUSED = {
    "test_train_with_entropy_filter": "top_entropy_quantile: its mask slot carries the token weights",
    "test_train_with_tools": "tools: the statistics pass does not yet apply TRL's tool_mask",
    "test_train_with_malformed_tool_calls": "tools: the statistics pass does not yet apply TRL's tool_mask",
}
MODEL_ID = re.compile(r"trl-internal-testing/tiny-[\w.\-]+")


def _model_ids(item) -> set[str]:
    """The hub models a TRL test loads: its model-id parameter if it has one, else the ids its source names."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    chosen = {v for v in params.values() if isinstance(v, str) and MODEL_ID.fullmatch(v)}
    if chosen:
        return chosen
    try:
        return set(MODEL_ID.findall(inspect.getsource(item.function)))
    except (OSError, TypeError):
        return set()


def pytest_collection_modifyitems(config, items):
    ours = os.environ.get("STARE_TRL_PARITY_TRAINER", "ours") == "ours"
    here = os.path.dirname(__file__)
    for item in items:
        if not str(item.fspath).startswith(here):
            continue
        if not any(f in item.nodeid for f in FAST):
            item.add_marker(pytest.mark.slow)
        missing = sorted(_model_ids(item) - set(standins.STANDINS))
        if missing:
            why = "; ".join(f"{m}: {standins.MISSING.get(m, 'no stand-in written')}" for m in missing)
            item.add_marker(pytest.mark.skip(reason=f"no local stand-in: {why}"))
        refusal = next((r for name, r in REFUSED.items() if name in item.nodeid), None)
        if ours and refusal:
            item.add_marker(pytest.mark.xfail(raises=ValueError, strict=True, reason=f"refused: {refusal}"))


@pytest.fixture(scope="session", autouse=True)
def hub_standins(tmp_path_factory):
    import huggingface_hub.constants as hub
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a second thread only contends (10× slower on a loaded machine)
    root = tmp_path_factory.mktemp("hub")
    failed = standins.build_hub_cache(root)
    standins.write_manifest(root, failed)
    qwen_root = tmp_path_factory.mktemp("hub_qwen_ids")
    standins.build_hub_cache(qwen_root, qwen_ids=True)
    _caches.update(default=str(root), qwen_ids=str(qwen_root))
    saved = hub.HF_HUB_CACHE, hub.HF_HUB_OFFLINE
    hub.HF_HUB_CACHE, hub.HF_HUB_OFFLINE = str(root), True  # offline even if the hub was imported before conftest
    yield failed
    hub.HF_HUB_CACHE, hub.HF_HUB_OFFLINE = saved
    torch.set_num_threads(threads)


_caches: dict[str, str] = {}


@pytest.fixture(autouse=True)
def qwen_sized_where_needed(request, hub_standins):
    """The tests in standins.QWEN_IDS_TESTS see the Qwen2.5 stand-ins with Qwen's vocabulary and special ids."""
    import huggingface_hub.constants as hub

    if not any(name in request.node.nodeid for name in standins.QWEN_IDS_TESTS):
        yield
        return
    hub.HF_HUB_CACHE = _caches["qwen_ids"]
    yield
    hub.HF_HUB_CACHE = _caches["default"]
