"""stare_lab.signals against slow, obviously correct references (tests/support/ref_signals.py) on a tiny
random Qwen2 (GQA 4/2)."""

from __future__ import annotations

import math

import pytest
import torch
from ref_signals import eager_attentions, naive_js, naive_vocab, reference_ae, reference_ae_fast
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from stare_lab.signals import attention_entropy, forward_with_stats, js_to_group_mean, predictive_entropy, vocab_stats
from stare_lab.signals.attention import chunked_attention_entropy, last_query_scores, score_rows_entropy

V = 50


def _model(attn: str = "sdpa") -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        max_position_embeddings=512,
        initializer_range=0.2,  # peaky attention and logits, so AE and H spread out
        attn_implementation=attn,
    )
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model():
    return _model()


def _batch(T: int = 13, B: int = 4, seed: int = 1):
    """Row 0 left-padded (prompt), row 1 right-padded (completion), row 2 both, row 3 full."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, :4] = 0
    mask[1, T - 5 :] = 0
    mask[2, :2] = 0
    mask[2, T - 3 :] = 0
    return ids, mask


@pytest.fixture(scope="module")
def eager_case(model):
    ids, mask = _batch()
    return ids, mask, eager_attentions(model, ids, mask)


@pytest.mark.parametrize("layers, chunk", [((1,), 1), ((1,), 5), ((0, 2, 3), 5), ((0, 2, 3), 128), (3, 4), (None, 13)])
def test_attention_entropy_matches_eager(model, eager_case, layers, chunk):
    ids, mask, attentions = eager_case
    got = attention_entropy(model, ids, mask, layers=layers, chunk_queries=chunk)
    resolved = {None: (2,), 3: (3,)}.get(layers, layers)  # None = 4 // 2
    ref = reference_ae(attentions, mask, resolved)
    assert got.dtype == torch.float32 and got.shape == mask.shape
    assert ref[mask.bool()].std() > 0.05  # the check is not against a constant
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got[mask == 0] == 0).all()
    assert got.min() >= 0 and got.max() <= 1 + 1e-6
    assert model.config._attn_implementation == "sdpa"  # restored


def test_attention_entropy_without_padding_and_from_eager_model():
    """All-ones mask: sdpa's mask builder returns None (plain causal). Start from an eager model."""
    model = _model("eager")
    ids, _ = _batch(T=9)
    mask = torch.ones_like(ids)
    ref = reference_ae(eager_attentions(model, ids, mask), mask, (1, 2))
    got = attention_entropy(model, ids, mask, layers=[1, 2], chunk_queries=4)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got[:, 0] == 0).all()  # n_t = 1
    assert model.config._attn_implementation == "eager"


def test_forward_with_stats_one_pass(model):
    ids, mask = _batch()
    with torch.no_grad():
        want_hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    hidden, ae = forward_with_stats(model, ids, mask, ae_layers=(1, 3), chunk_queries=3)
    v = mask.bool()
    torch.testing.assert_close(hidden[v], want_hidden[v], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ae, attention_entropy(model, ids, mask, layers=(1, 3)), atol=1e-6, rtol=0)
    hidden2, none = forward_with_stats(model, ids, mask)
    assert none is None
    torch.testing.assert_close(hidden2[v], want_hidden[v])


def test_attention_entropy_first_position_and_bad_layer(model):
    ids, mask = _batch()
    full = attention_entropy(model, ids, mask, layers=1)
    part = attention_entropy(model, ids, mask, layers=1, first_position=6, chunk_queries=4)
    assert (part[:, :6] == 0).all()
    torch.testing.assert_close(part[:, 6:], full[:, 6:], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="out of range"):
        attention_entropy(model, ids, mask, layers=(4,))
    assert model.config._attn_implementation == "sdpa"


def test_attention_entropy_long_sequence_odd_chunk(model):
    ids, mask = _batch(T=300, B=3, seed=3)
    got = attention_entropy(model, ids, mask, layers=(2,), chunk_queries=7)
    torch.testing.assert_close(got, reference_ae_fast(eager_attentions(model, ids, mask)[2], mask), atol=1e-5, rtol=0)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_last_query_attention_entropy_is_the_last_row_of_the_chunked_one(mask_kind, softcap):
    """Generation's per-step AE (newest query only) against the chunked function's last row: left padding,
    grouped-query heads, a KV cache longer than the query block, soft-capped scores."""
    g = torch.Generator().manual_seed(7)
    B, Hq, Hkv, Tq, Tk, D = 3, 6, 2, 4, 11, 8
    q, k = torch.randn(B, Hq, Tq, D, generator=g), torch.randn(B, Hkv, Tk, D, generator=g)
    pad = torch.tensor([0, 2, 9])  # row 2 attends to 2 keys only
    allowed = (torch.arange(Tk)[None, None, :] >= pad[:, None, None]) & (
        torch.arange(Tk)[None, None, :] <= torch.arange(Tq)[None, :, None] + Tk - Tq
    )
    if mask_kind == "none":
        mask, pad = None, torch.zeros(3, dtype=torch.long)
    elif mask_kind == "bool":
        mask = allowed[:, None]
    else:
        mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[:, None]
    ref = chunked_attention_entropy(q, k, mask, 0.3, chunk_queries=2, first_position=Tq - 1, softcap=softcap)
    got = score_rows_entropy(last_query_scores(q, k, mask, 0.3, softcap=softcap))
    assert got.shape == (B,)
    torch.testing.assert_close(got, ref[:, -1], atol=1e-6, rtol=0)
    assert (got > 0.05).all()  # not a trivially equal zero


class _MaxNumel(TorchDispatchMode):
    """Largest tensor any op produced: a memory bound that does not depend on timing."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            a.untyped_storage().data_ptr()
            for a in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(a, torch.Tensor)
        }
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs:  # views allocate nothing
                self.max_numel = max(self.max_numel, o.numel())
        return out


def test_chunked_attention_entropy_memory_bound():
    B, Hq, Hkv, T, D, chunk = 2, 4, 2, 300, 8, 7
    q, k = torch.randn(B, Hq, T, D), torch.randn(B, Hkv, T, D)
    mask = torch.ones(B, 1, T, T, dtype=torch.bool).tril()
    with _MaxNumel() as spy:
        got = chunked_attention_entropy(q, k, mask, 0.3, chunk_queries=chunk)
    assert spy.max_numel <= max(B * Hq * chunk * T, B * Hkv * T * D)  # never heads × T × T
    torch.testing.assert_close(got, chunked_attention_entropy(q, k, None, 0.3, chunk_queries=T), atol=1e-6, rtol=0)


@pytest.mark.parametrize("chunk", [1, 7, 1024])
@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_vocab_stats_matches_full_softmax(chunk, tau):
    g = torch.Generator().manual_seed(0)
    hidden, W = torch.randn(3, 11, 16, generator=g), torch.randn(V, 16, generator=g)
    b, targets = torch.randn(V, generator=g), torch.randint(0, V, (3, 11), generator=g)
    got = vocab_stats(
        hidden, W, targets, temperature=tau, want=("entropy", "p2", "p2logp"), chunk_tokens=chunk, lm_head_bias=b
    )
    ref = naive_vocab(hidden, W, b, targets, tau)
    assert set(got) == {"logp", "entropy", "p2", "p2logp"}
    assert ref["entropy"].std() > 0.1
    for k in got:
        assert got[k].dtype == torch.float32
        torch.testing.assert_close(got[k], ref[k].float(), atol=1e-5, rtol=1e-5)
    capped = vocab_stats(
        hidden, W, targets, temperature=tau, want=("entropy",), chunk_tokens=chunk, final_logit_softcapping=3.0
    )
    torch.testing.assert_close(
        capped["entropy"], naive_vocab(hidden, W, None, targets, tau, 3.0)["entropy"].float(), atol=1e-5, rtol=1e-5
    )
    assert set(vocab_stats(hidden, W, targets, want=()).keys()) == {"logp"}
    with pytest.raises(ValueError, match="entropyy"):
        vocab_stats(hidden, W, targets, want=("entropyy",))


def test_vocab_stats_long_sequence_and_memory_bound():
    g = torch.Generator().manual_seed(1)
    B, T, H, chunk = 2, 300, 8, 7
    hidden, W = torch.randn(B, T, H, generator=g), torch.randn(V, H, generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    with _MaxNumel() as spy:
        got = vocab_stats(hidden, W, targets, want=("entropy", "p2"), chunk_tokens=chunk)
    assert spy.max_numel <= max(chunk * V, B * T * H)  # never B × T × V
    ref = naive_vocab(hidden, W, None, targets, 1.0)
    for k in got:
        torch.testing.assert_close(got[k], ref[k].float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_predictive_entropy_matches_model_logits(model, tau):
    ids, mask = _batch()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.double() / tau
    logp = torch.log_softmax(logits, -1)
    ref = -(logp.exp() * logp).sum(-1).float()
    got = predictive_entropy(model, ids, mask, temperature=tau)
    v = mask.bool()
    assert ref[v].std() > 0.05
    torch.testing.assert_close(got[v], ref[v], atol=1e-5, rtol=1e-5)
    assert (got[~v] == 0).all()


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_js_to_group_mean_matches_loop(chunk):
    g = torch.Generator().manual_seed(2)
    B, T, H = 7, 9, 12
    hidden, W = torch.randn(B, T, H, generator=g), 2 * torch.randn(V, H, generator=g)
    group = torch.tensor([0, 0, 0, 5, 5, 5, 9])  # group 9 has one rollout
    live = torch.ones(B, T, dtype=torch.long)
    live[0, 6:] = 0  # right-padded completion
    live[1, 4:] = 0
    live[2, :] = 0  # fully masked row
    live[3:6, 7:] = 0
    live[5, 5:] = 0
    live[4, 5:] = 0  # group 5 at t=5,6: only row 3 live
    got = js_to_group_mean(hidden, W, group, live, temperature=0.8, chunk_positions=chunk)
    ref = naive_js(hidden, W, group, live, 0.8)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert (got[2] == 0).all() and (got[6] == 0).all() and (got[3, 5:] == 0).all() and (got[0, 4:] == 0).all()
    assert (got[0, :4] > 0).all()
    assert got.min() >= 0 and got.max() <= math.log(2) + 1e-6


def test_js_long_sequence_memory_bound_and_contiguity():
    g = torch.Generator().manual_seed(4)
    B, T, H, chunk = 4, 300, 6, 7
    hidden, W = torch.randn(B, T, H, generator=g), torch.randn(V, H, generator=g)
    group, live = torch.tensor([0, 0, 1, 1]), torch.ones(B, T)
    live[1, 250:] = 0
    with _MaxNumel() as spy:
        got = js_to_group_mean(hidden, W, group, live, chunk_positions=chunk)
    assert spy.max_numel <= max(2 * chunk * V, B * T * H)  # G × chunk × V, never G × T × V
    assert (got[:2, 250:] == 0).all() and (got[2:, 250:] > 0).all()
    torch.testing.assert_close(
        got[:, 240:260], naive_js(hidden[:, 240:260], W, group, live[:, 240:260], 1.0), atol=1e-5, rtol=1e-5
    )
    with pytest.raises(ValueError, match="contiguous"):
        js_to_group_mean(hidden, W, torch.tensor([0, 1, 0, 1]), live)


def test_peft_wrapped_model_keeps_adapters():
    peft = pytest.importorskip("peft")
    model = _model()
    ids, mask = _batch()
    wrapped = peft.get_peft_model(
        model, peft.LoraConfig(r=4, target_modules=["q_proj", "k_proj", "lm_head"], init_lora_weights=False)
    ).eval()
    with torch.no_grad():
        logp = torch.log_softmax(wrapped(input_ids=ids, attention_mask=mask).logits.double(), -1)
    v = mask.bool()
    torch.testing.assert_close(
        predictive_entropy(wrapped, ids, mask)[v], -(logp.exp() * logp).sum(-1)[v].float(), atol=1e-5, rtol=1e-5
    )  # LoRA on lm_head included
    with_lora = attention_entropy(wrapped, ids, mask, layers=1)
    with wrapped.disable_adapter():
        without = attention_entropy(wrapped, ids, mask, layers=1)
    assert (with_lora - without).abs().max() > 1e-3  # LoRA on q/k is in the forward
