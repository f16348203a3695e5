"""One LM-head path for every statistic: token_statistics and predictive_entropy equal statistics of
`model(...).logits` on tiny random models whose head is not a plain weight: Gemma-2-style logit
soft-capping, Granite-style logit scaling, a bias on the head, LoRA on lm_head, and a multimodal
PaliGemma (Gemma-2 text model) whose soft-cap lives in the text config only."""

from __future__ import annotations

import math

import pytest
import torch

from stare_lab.signals import predictive_entropy, token_statistics

V = 40
P, T, G = 5, 7, 2


def _gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        final_logit_softcapping=1.5,
        initializer_range=0.5,
        attn_implementation="eager",
    )  # Gemma-2 has no sdpa path (attention soft-capping)
    return Gemma2ForCausalLM(cfg)


def _granite():
    from transformers import GraniteConfig, GraniteForCausalLM

    cfg = GraniteConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        logits_scaling=4.0,
        initializer_range=0.5,
        attn_implementation="sdpa",
    )
    return GraniteForCausalLM(cfg)


def _qwen2(bias: bool = False):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.5,
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(cfg)
    if bias:  # a head with a bias (as some vendors' heads have)
        head = torch.nn.Linear(32, V, bias=True)
        head.weight.data.copy_(model.lm_head.weight.data)
        torch.nn.init.normal_(head.bias, std=2.0)
        model.lm_head = head
    return model


def _lora_head():
    peft = pytest.importorskip("peft")
    return peft.get_peft_model(_qwen2(), peft.LoraConfig(r=4, target_modules=["lm_head"], init_lora_weights=False))


def _paligemma_gemma2():
    """A multimodal model whose soft-cap is in its text config only (model.config has none)."""
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    text = dict(
        model_type="gemma2",
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        final_logit_softcapping=1.5,
        initializer_range=0.5,
    )
    vision = dict(
        model_type="siglip_vision_model",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=8,
        projection_dim=32,
    )
    cfg = PaliGemmaConfig(text_config=text, vision_config=vision, image_token_index=V - 1, projection_dim=32)
    cfg.text_config._attn_implementation = "eager"
    model = PaliGemmaForConditionalGeneration(cfg)
    assert getattr(model.config, "final_logit_softcapping", None) is None
    return model


MODELS = {
    "gemma2_softcap": _gemma2,
    "granite_scaling": _granite,
    "head_bias": lambda: _qwen2(bias=True),
    "lora_on_lm_head": _lora_head,
    "paligemma_text_config": _paligemma_gemma2,
}


def _batch(seed: int = 0):
    """TRL's layout: 2 prompts × G rollouts, prompts left-padded, completions right-padded."""
    g = torch.Generator().manual_seed(seed)
    B = 2 * G
    prompt_ids, completion_ids = (
        torch.randint(0, V - 2, (B, P), generator=g),
        torch.randint(0, V - 2, (B, T), generator=g),
    )
    prompt_mask, completion_mask = torch.ones(B, P, dtype=torch.long), torch.ones(B, T, dtype=torch.long)
    prompt_mask[2:, :2] = 0
    completion_mask[1, 4:] = 0
    completion_mask[3, 2:] = 0
    return dict(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids, completion_mask=completion_mask
    )


def _reference(model, batch, tau):
    """Statistics of softmax(model(...).logits / τ), the definition TRL's own log-prob pass uses."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, P - 1 : P + T - 1].double() / tau
    logp = torch.log_softmax(logits, -1)
    p = logp.exp()
    out = {
        "logp": logp.gather(-1, batch["completion_ids"][..., None])[..., 0],
        "entropy": -(p * logp).sum(-1),
        "p2": (p * p).sum(-1),
        "p2logp": (p * p * logp).sum(-1),
    }
    live = batch["completion_mask"].bool()
    js = torch.zeros(2 * G, T, dtype=torch.float64)
    for r0 in range(0, 2 * G, G):  # loop over groups, positions and live rows
        for t in range(T):
            rows = [r for r in range(r0, r0 + G) if live[r, t]]
            if len(rows) < 2:
                continue
            mean = sum(p[r, t] for r in rows) / len(rows)
            for r in rows:
                m = (p[r, t] + mean) / 2
                js[r, t] = 0.5 * (p[r, t] * (p[r, t] / m).log()).sum() + 0.5 * (mean * (mean / m).log()).sum()
    out["js"] = js
    return out, live


@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("kind", list(MODELS))
def test_statistics_equal_those_of_the_model_logits(kind, tau):
    torch.manual_seed(0)
    model = MODELS[kind]().eval()
    batch = _batch()
    ref, live = _reference(model, batch, tau)
    got = token_statistics(
        model,
        batch,
        {"logp", "entropy", "p2", "p2logp", "js"},
        num_generations=G,
        temperature=tau,
        chunk_tokens=5,
        chunk_positions=3,
    )
    assert ref["entropy"][live].std() > 0.02  # a check against something that varies
    for name in ("logp", "entropy", "p2", "p2logp", "js"):
        torch.testing.assert_close(got[name][live], ref[name][live].float(), atol=2e-5, rtol=2e-5, msg=name)


@pytest.mark.parametrize("kind", list(MODELS))
def test_predictive_entropy_uses_the_same_head(kind):
    torch.manual_seed(0)
    model = MODELS[kind]().eval()
    batch = _batch(1)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.double(), -1)
    v = mask.bool()
    torch.testing.assert_close(
        predictive_entropy(model, ids, mask)[v], -(logp.exp() * logp).sum(-1)[v].float(), atol=2e-5, rtol=2e-5
    )


def test_the_head_matters_in_these_models():
    """The cases are not vacuous: the raw head weight gives a different entropy in each."""
    from stare_lab.signals import vocab_stats
    from stare_lab.signals.attention import forward_with_stats, unwrap_model

    batch = _batch()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    for kind, build in MODELS.items():
        torch.manual_seed(0)
        model = build().eval()
        hidden, _ = forward_with_stats(model, ids, mask)
        raw = vocab_stats(
            hidden[:, P - 1 : P + T - 1], unwrap_model(model).get_output_embeddings().weight, batch["completion_ids"]
        )["entropy"]
        right = token_statistics(model, batch, {"entropy"}, num_generations=G)["entropy"]
        assert (raw - right).abs().max() > 1e-2, kind
        assert math.isfinite(float(right.sum()))
