"""The statistics pass on a vision-language batch: the image inputs reach its forward as TRL passes them.

A tiny random Qwen2-VL (built from a config, no download) and a batch laid out as TRL's generation step
returns it (flat pixel_values over every image's patches, image_grid_thw, num_images, mm_token_type_ids
over prompt + completion). The pass's completion log-probs and entropies equal TRL's own
`_get_per_token_logps_and_entropies` on the same batch with the same row chunking, and other pixels give
other statistics (the images are not dropped). Statistics cover completion tokens only: [B, T].
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures_trainer import cpu_config, rule_trainer
from tiny_vlm import IMAGE, VISION_END, VISION_START, tiny_qwen2_vl

from stare_lab.models.builtin import build_tokenizer
from stare_lab.signals import token_statistics
from stare_lab.tasks.arithmetic import ArithmeticTask

B, T, G = 4, 6, 2


def vlm_batch(seed=0):
    """Rows 0-1 see one 16×16 image (4 merged image tokens), rows 2-3 two images (8 tokens, left-padded
    prompt), so a forward of rows [2, 4) must cut pixel_values by image and patch, not by row."""
    gen = torch.Generator().manual_seed(seed)
    one = [0] * 6 + [5, VISION_START] + [IMAGE] * 4 + [VISION_END, 6]
    two = [5, VISION_START] + [IMAGE] * 4 + [VISION_END, VISION_START] + [IMAGE] * 4 + [VISION_END, 6]
    prompt_ids = torch.tensor([one, one, two, two])
    prompt_mask = torch.tensor([[0] * 6 + [1] * 8] * 2 + [[1] * 14] * 2)
    completion_ids = torch.randint(3, 90, (B, T), generator=gen)
    completion_mask = (torch.arange(T)[None] < torch.tensor([T, T - 2, 3, T])[:, None]).long()
    num_images = [1, 1, 2, 2]
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "pixel_values": torch.randn(sum(num_images) * 16, 3 * 2 * 4 * 4, generator=gen),
        "image_grid_thw": torch.tensor([[1, 4, 4]] * sum(num_images)),
        "num_images": num_images,
        "mm_token_type_ids": torch.cat([(prompt_ids == IMAGE).long(), torch.zeros(B, T, dtype=torch.long)], 1),
    }


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    torch.manual_seed(0)
    args = cpu_config(
        tmp_path_factory.mktemp("vlm"),
        per_device_train_batch_size=4,
        num_generations=G,
        max_completion_length=T,
        temperature=0.7,
    )
    t = rule_trainer(
        build_tokenizer(),
        tiny_qwen2_vl(),
        args,
        ArithmeticTask(train_size=8, heldout_size=4).train_dataset(),
        "top_entropy",
        reward=lambda completions, **kw: [0.0] * len(completions),
    )
    t.model.eval()
    return t


def trl_statistics(trainer, batch, rows):
    """TRL's own completion log-probs and entropies, `rows` rows per forward."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    mm = {k: batch[k] for k in ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")}
    with torch.no_grad():
        logp, entropy, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, T, batch_size=rows, compute_entropy=True, **mm
        )
    return logp, entropy


@pytest.mark.parametrize("rows", [2, 4])
def test_statistics_pass_equals_trl_forward_on_images(trainer, rows):
    batch = vlm_batch()
    trl_logp, trl_entropy = trl_statistics(trainer, batch, rows)
    ours = token_statistics(
        trainer.model, batch, {"logp", "entropy"}, num_generations=G, temperature=0.7, rows_per_forward=rows
    )
    m = batch["completion_mask"].bool()
    assert ours["logp"].shape == (B, T)
    assert torch.allclose(ours["logp"][m], trl_logp[m], atol=1e-5), (ours["logp"][m] - trl_logp[m]).abs().max()
    assert torch.allclose(ours["entropy"][m], trl_entropy[m], atol=1e-5)


def test_images_reach_the_statistics_pass(trainer):
    batch = vlm_batch()
    other = dict(batch, pixel_values=batch["pixel_values"] + 1.0)
    a, b = (token_statistics(trainer.model, x, {"entropy"}, num_generations=G)["entropy"] for x in (batch, other))
    m = batch["completion_mask"].bool()
    assert (a[m] - b[m]).abs().max() > 1e-4
    text_only = {
        k: v for k, v in batch.items() if k not in ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")
    }
    dropped = token_statistics(trainer.model, text_only, {"entropy"}, num_generations=G)["entropy"]
    assert (a[m] - dropped[m]).abs().max() > 1e-4  # what dropping the images (the old pass) computed


def test_trainer_rule_on_a_vlm_batch_reads_completion_tokens_only(trainer):
    batch = vlm_batch()
    batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])
    stats, _ = trainer._token_stats(copy.copy(batch))
    assert stats.shape == (B, T) and stats.entropy is not None
    weights = trainer.rule(stats, trainer.rule_state).weights
    assert weights.shape == (B, T) and bool((weights[batch["completion_mask"] == 0] == 0).all())
