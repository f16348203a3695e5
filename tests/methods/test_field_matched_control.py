"""The matched control of the per-micro-batch rules (issue 26.6): `full` with scope "microbatch" trains every
valid token under the aggregation Clip-Cov and KL-Cov use at their default scope (verl's legacy dp_actor
token mean per micro-batch × 1/gradient_accumulation), on a real run whose generation batches TRL splits
into 2 micro-batches of unequal token counts, against the slow reference of
tests/training/test_microbatch_official.py (set-up: tests/support/microbatch_support.py); with
`microbatch_aggregation: trl` it is plain `full` to the bit."""

from __future__ import annotations

import pytest
import torch
from microbatch_support import GA, check_run, microbatch_trainer, record_micro_batches, setup, verl_denominator  # noqa: F401

from stare_lab.methods import get_method


def test_full_per_micro_batch_is_verls_token_mean_like_clip_cov_and_kl_cov(setup, tmp_path):
    steps = record_micro_batches(microbatch_trainer(setup, tmp_path, get_method("full", scope="microbatch"), steps=2))

    def reference(micro, k):
        mask = micro["inputs"]["completion_mask"].float()
        return mask, torch.ones(mask.shape)  # weight 1 on every valid token; every valid token counted

    reference.score = "entropy"
    check_run(steps, reference, verl_denominator)
    # the two micro-batches of a step hold different token counts: verl's token mean is not TRL's dapo here
    counts = [[float(m["inputs"]["completion_mask"].sum()) for m in s["micro"]] for s in steps]
    assert any(len(set(c)) > 1 for c in counts), counts
    for step in steps:
        for micro in step["micro"]:
            assert torch.equal(micro["inputs"]["token_weights"], micro["inputs"]["completion_mask"].float())


def test_the_same_aggregation_as_clip_cov_and_kl_cov():
    """The control's settings are those of the rules it controls for: the same scope, hence the trainer's
    `microbatch_aggregation` and `microbatch_ranks` act on it as on them."""
    for name in ("clip_cov", "kl_cov"):
        assert get_method(name).params.scope == "microbatch"
    assert get_method("full", scope="microbatch").params.scope == "microbatch"
    assert get_method("full").params.scope == "batch"
    with pytest.raises(ValueError, match="scope='group' is not one of batch, microbatch"):
        get_method("full", scope="group")


def test_with_trls_aggregation_the_control_is_plain_full(setup, tmp_path):
    plain = record_micro_batches(microbatch_trainer(setup, tmp_path / "plain", get_method("full"), steps=2))
    trl = record_micro_batches(
        microbatch_trainer(
            setup, tmp_path / "trl", get_method("full", scope="microbatch"), steps=2, microbatch_aggregation="trl"
        )
    )
    for a, b in zip(plain, trl, strict=True):
        for x, y in zip(a["micro"], b["micro"], strict=True):
            torch.testing.assert_close(x["grad"], y["grad"], rtol=1e-6, atol=1e-10)
