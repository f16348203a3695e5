"""Token weights on the model families TRL trains beyond text-only dense LMs: MoE and vision-language.

- MoE (a tiny random Qwen3-MoE, 4 experts, router aux loss coefficient 0.01): TRL adds
  coef · aux_loss for every rule; `full` equals plain TRL to the bit, a selecting rule equals the
  loop reference (which adds the aux loss of the same forward).
- VLM (a tiny random Qwen2-VL with a vision tower): the image inputs reach the loss exactly as TRL
  passes them; `full` equals plain TRL to the bit, the vision tower gets a gradient, and only
  completion tokens carry weights (image tokens sit in the prompt, outside the [B, T] weights).
No downloads: both models are built from configs with the built-in character tokenizer.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures_trainer import cpu_config
from loss_compose_support import (
    assert_full_equals_plain,
    current_logps,
    length_reward,
    make_pair,  # noqa: F401
    selecting_weights,
    weighted,
)
from ref_loss_compose import reference_loss
from tiny_vlm import IMAGE, VISION_END, VISION_START, tiny_qwen2_vl
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from trl import GRPOTrainer

from stare_lab.methods import NORMALIZE, get_method
from stare_lab.models.builtin import build_tokenizer
from stare_lab.tasks.arithmetic import ArithmeticTask
from stare_lab.training.trainer import TokenRuleGRPOTrainer


@pytest.fixture(scope="module")
def moe_setup(tmp_path_factory):
    torch.manual_seed(0)
    tok = build_tokenizer()
    config = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.01,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return tok, Qwen3MoeForCausalLM(config), None, ArithmeticTask(train_size=64, heldout_size=16)


MOE_FEATURES = {
    "dapo": dict(loss_type="dapo"),
    "gspo_bonus": dict(loss_type="grpo", importance_sampling_level="sequence", entropy_coef=0.1),
}


@pytest.mark.parametrize("feature", list(MOE_FEATURES))
def test_moe_full_equals_plain_trl_with_aux_loss(moe_setup, tmp_path, feature):
    plain, ours, batch = make_pair(moe_setup, tmp_path, MOE_FEATURES[feature])
    assert ours.aux_loss_enabled and ours.router_aux_loss_coef == 0.01
    assert_full_equals_plain(plain, ours, batch)
    assert ours._metrics["train"]["aux_loss"], "TRL logs the aux loss it added"
    router = [p.grad for n, p in ours.model.named_parameters() if "mlp.gate" in n]
    assert router and all(g is not None and g.abs().sum() > 0 for g in router)


@pytest.mark.parametrize("normalize", ["valid", "selected"])
def test_moe_selecting_rule_equals_loop_reference(moe_setup, tmp_path, normalize):
    _, ours, batch = make_pair(moe_setup, tmp_path, MOE_FEATURES["gspo_bonus"])
    w = selecting_weights(batch["completion_mask"], "fractional", seed=5)
    batch = weighted(batch, w, normalize)
    logp, entropies, aux = current_logps(ours, batch)
    assert aux is not None and aux.item() > 0
    expected = reference_loss(ours, batch, logp, entropies, w, normalize, aux)
    assert ours._compute_loss(ours.model, batch).item() == pytest.approx(expected, rel=1e-5, abs=1e-7)


def vlm_batch(B=4, T=6, seed=0):
    """A batch as TRL's generation step returns it for Qwen2-VL: one 16×16 image per prompt (4×4 patches of 4
    pixels, merged 2×2 into 4 image tokens), mm_token_type_ids over prompt + completion, padded completions."""
    gen = torch.Generator().manual_seed(seed)
    prompt = [5, VISION_START, IMAGE, IMAGE, IMAGE, IMAGE, VISION_END, 6]
    prompt_ids = torch.tensor([prompt] * B)
    completion_ids = torch.randint(3, 90, (B, T), generator=gen)
    lengths = torch.tensor([T, T - 2, 3, T])
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    mm_types = torch.cat([(prompt_ids == IMAGE).long(), torch.zeros(B, T, dtype=torch.long)], 1)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "pixel_values": torch.randn(B * 16, 3 * 2 * 4 * 4, generator=gen),
        "image_grid_thw": torch.tensor([[1, 4, 4]] * B),
        "num_images": [1] * B,
        "mm_token_type_ids": mm_types,
        "advantages": torch.tensor([1.0, -0.5, 0.8, -1.2]),
        "num_items_in_batch": completion_mask.sum(),
        "token_weights": completion_mask.clone(),
        "token_weight_total": completion_mask.sum(),
        "token_normalize": torch.tensor(NORMALIZE.index("loss_type")),
        "token_selected": completion_mask.float(),
    }


@pytest.fixture(scope="module")
def vlm_pair(tmp_path_factory):
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = tiny_qwen2_vl()
    args = cpu_config(
        tmp_path_factory.mktemp("vlm"),
        per_device_train_batch_size=4,
        num_generations=4,
        gradient_accumulation_steps=2,
        max_completion_length=6,
        entropy_coef=0.05,
        epsilon_high=0.28,
    )
    ds = ArithmeticTask(train_size=8, heldout_size=4).train_dataset()
    plain = GRPOTrainer(
        model=copy.deepcopy(model), reward_funcs=[length_reward], args=args, train_dataset=ds, processing_class=tok
    )
    ours = TokenRuleGRPOTrainer(
        model=copy.deepcopy(model),
        reward_funcs=[length_reward],
        args=args,
        train_dataset=ds,
        processing_class=tok,
        rule=get_method("full"),
    )
    for t in (plain, ours):
        t.model.train()
        t.current_gradient_accumulation_steps = 2
    batch = vlm_batch()
    logp = current_logps(ours, batch)[0]
    batch["old_per_token_logps"] = logp + 0.2 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    return plain, ours, batch


def test_vlm_full_equals_plain_trl_and_trains_the_vision_tower(vlm_pair):
    plain, ours, batch = vlm_pair
    assert_full_equals_plain(plain, ours, batch)
    vision = [p.grad for n, p in ours.model.named_parameters() if ".visual." in f".{n}"]
    assert vision and any(g is not None and g.abs().sum() > 0 for g in vision), "the vision tower needs a gradient"


def test_vlm_image_inputs_change_the_log_probs(vlm_pair):
    """The batch's image really reaches the forward: other pixels give other completion log-probs."""
    _, ours, batch = vlm_pair
    other = dict(batch, pixel_values=batch["pixel_values"] + 1.0)
    assert not torch.allclose(current_logps(ours, batch)[0], current_logps(ours, other)[0])


@pytest.mark.parametrize("normalize", ["valid", "selected"])
def test_vlm_selecting_rule_equals_loop_reference(vlm_pair, normalize):
    _, ours, batch = vlm_pair
    w = selecting_weights(batch["completion_mask"], "binary", seed=6)
    w[1, 0] = 1.0  # rows 1-3 keep at least one token
    batch = weighted(batch, w, normalize)
    assert w.shape == batch["completion_ids"].shape  # weights exist for completion tokens only
    logp, entropies, _ = current_logps(ours, batch)
    expected = reference_loss(ours, batch, logp, entropies, w, normalize)
    assert ours._compute_loss(ours.model, batch).item() == pytest.approx(expected, rel=1e-5, abs=1e-7)
