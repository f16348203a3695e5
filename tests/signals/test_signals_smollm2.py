"""stare_lab.signals on a real LM, `model=smollm2` (49,152 tokens, 30 layers, grouped-query attention with
9 query heads over 3 KV heads), against the slow float64 references of tests/support/ref_signals.py that
tests/signals/test_signals.py applies to the built-in shapes: real rollouts (chat prompts of two lengths,
so one group is left-padded, completions sampled at τ = 0.8), rows ending at different lengths, two groups.

- predictive entropy at every position against a float64 softmax of the model's own logits;
- the statistics pass (logp, entropy, Σp², Σp²·log p, JS to the group mean, attention entropy at three
  layers) against the references on the same rollouts, with its default chunks and with small ones that
  cut every vocabulary, query and position loop into pieces;
- attention entropy against the eager attention maps (head mean over the 9 query heads);
- what the generation recorder gives while transformers samples, against the pass.
"""

from __future__ import annotations

import pytest
import torch
from ref_signals import eager_attentions, naive_js, naive_vocab, reference_ae

from stare_lab.models import load_model_and_tokenizer
from stare_lab.signals import attention_entropy, predictive_entropy, token_statistics
from stare_lab.signals.generation import record_generation

G, NEW, TAU = 3, 10, 0.8  # rollouts per prompt, new tokens, sampling temperature
LAYERS = (0, 15, 29)  # first, middle (the default layer: 30 // 2) and last
NEEDS = {"logp", "entropy", "p2", "p2logp", "js", "attn_entropy"}
QUESTIONS = ("What is 7+5?", "Name a colour that the sky can have at sunset.")
# float32 against float64 (with rtol 1e-5): 49,152-term sums in float32 chunks, and the pass's forward through
# the AE attention function against the reference's sdpa one (measured ≤ 9e-6, on logp down to -16)
ATOL = 1e-5
# generation against the pass: the cached step-by-step forward adds in another order than the full one
# (measured ≤ 2e-5 through 30 layers; the same bound as the built-in model's, tests/signals/test_stats_paths.py)
GEN_ATOL = 1e-4


@pytest.fixture(scope="module")
def smol(smollm2_folder):
    model, tok = load_model_and_tokenizer("smollm2")
    return tok, model.eval()


@pytest.fixture(scope="module")
def rollouts(smol):
    """(batch of 2 prompts × G rollouts as TRL holds it, the generation recorder's statistics, its EOS mask)."""
    tok, model = smol
    chats = [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
    ]
    enc = tok([c for c in chats for _ in range(G)], return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    with record_generation(
        model, NEEDS, temperature=TAU, attn_layers=LAYERS, js_group=G, eos_ids=(tok.eos_token_id,)
    ) as rec:
        seq = model.generate(
            **enc, do_sample=True, temperature=TAU, top_k=0, max_new_tokens=NEW, pad_token_id=tok.pad_token_id
        )
    comp = seq[:, enc.input_ids.size(1) :]
    eos = comp == tok.eos_token_id
    end = torch.where(eos.any(1), eos.int().argmax(1), torch.full((comp.size(0),), comp.size(1)))
    eos_mask = (torch.arange(comp.size(1))[None] <= end[:, None]).long()
    batch = dict(
        prompt_ids=enc.input_ids, prompt_mask=enc.attention_mask, completion_ids=comp, completion_mask=eos_mask
    )
    return batch, rec.result(comp, eos_mask), eos_mask


def shortened(batch):
    """The batch with rows 1 and 4 ending early (as if they had sampled EOS), so that completions are
    right-padded and a group has rows that stopped: JS then averages over the rows still live."""
    mask = batch["completion_mask"].clone()
    mask[1, 4:] = 0
    mask[4, 7:] = 0
    return {**batch, "completion_mask": mask}


@pytest.fixture(scope="module")
def reference_stats(smol, rollouts):
    """(the shortened batch, its float64 references): the slow loops run once for both chunk settings."""
    batch = shortened(rollouts[0])
    return batch, references(smol[1], batch)


def references(model, batch):
    """{statistic: [B, T] float64 reference} at the completion positions: position P + t - 1 describes token t."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    P, T = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
    with torch.no_grad():
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, P - 1 : P - 1 + T]
    W = model.get_output_embeddings().weight
    out = naive_vocab(hidden, W, None, batch["completion_ids"], TAU)
    group = torch.arange(ids.size(0)) // G
    out["js"] = naive_js(hidden, W, group, batch["completion_mask"], TAU)
    out["attn_entropy"] = reference_ae(eager_attentions(model, ids, mask), mask, LAYERS)[:, P - 1 : P - 1 + T]
    return out


def test_predictive_entropy_over_the_whole_vocabulary(smol, rollouts):
    tok, model = smol
    batch = rollouts[0]
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.double() / TAU
    assert logits.size(-1) == 49_152
    logp = torch.log_softmax(logits, -1)
    ref = -(logp.exp() * logp).sum(-1).float()
    got = predictive_entropy(model, ids, mask, temperature=TAU, chunk_tokens=7)
    v = mask.bool()
    assert ref[v].std() > 0.5  # real next-token entropies spread out
    torch.testing.assert_close(got[v], ref[v], atol=ATOL, rtol=1e-5)
    assert (got[~v] == 0).all()


@pytest.mark.parametrize(
    "chunks",
    [{}, {"chunk_tokens": 7, "chunk_queries": 5, "chunk_positions": 3, "rows_per_forward": G}],
    ids=["default_chunks", "small_chunks"],
)
def test_the_statistics_pass_equals_the_float64_references(smol, reference_stats, chunks):
    _, model = smol
    batch, ref = reference_stats
    got = token_statistics(model, batch, NEEDS, num_generations=G, temperature=TAU, attn_layers=LAYERS, **chunks)
    v = batch["completion_mask"].bool()
    for name in NEEDS:
        assert got[name].dtype == torch.float32 and got[name].shape == v.shape, name
        assert ref[name][v].abs().max() > 0.01, name  # not trivially 0
        torch.testing.assert_close(got[name][v], ref[name][v].float(), atol=ATOL, rtol=1e-5, msg=name)
    assert (got["js"][~v] == 0).all() and got["js"].max() <= torch.log(torch.tensor(2.0)) + 1e-6
    assert got["attn_entropy"].min() >= 0 and got["attn_entropy"].max() <= 1 + 1e-6


@pytest.mark.parametrize("layers, chunk", [(None, 128), ((0, 29), 7)])
def test_attention_entropy_with_grouped_query_heads_matches_eager(smol, rollouts, layers, chunk):
    """AE over every input position (prompt included), the model's 9 query heads sharing 3 KV heads."""
    _, model = smol
    batch = rollouts[0]
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    attentions = eager_attentions(model, ids, mask)
    assert attentions[0].shape[1] == 9 and model.config.num_key_value_heads == 3
    got = attention_entropy(model, ids, mask, layers=layers, chunk_queries=chunk)
    ref = reference_ae(attentions, mask, (15,) if layers is None else layers)
    assert ref[mask.bool()].std() > 0.05
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    assert model.config._attn_implementation == "sdpa"  # restored


def test_the_generation_recording_equals_the_pass(smol, rollouts):
    """The statistics recorded while sampling (no forward of their own), against the pass on those rollouts."""
    _, model = smol
    batch, recorded, mask = rollouts
    assert recorded is not None and set(recorded) == NEEDS
    ref = token_statistics(model, batch, NEEDS, num_generations=G, temperature=TAU, attn_layers=LAYERS)
    for name in NEEDS:
        diff = ((recorded[name] - ref[name]) * mask).abs().max().item()
        assert diff <= GEN_ATOL, (name, diff)
