"""Byte-level BPE pieces on the token page: a character split over tokens is shown decoded at the token
that completes it (never as U+FFFD), the raw pieces on hover, and the top-token list names such a
token by its raw piece and bytes. A real byte-level BPE tokenizer is trained in the test."""

from __future__ import annotations

import html
import json
import re

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from stare_lab.record.kept_batch import batch_path
from stare_lab.training.kept_batches import piece_bytes, token_pieces
from stare_lab.viewer import load_batch, save_batch
from stare_lab.viewer.browser import chromium_path, dump_dom
from stare_lab.viewer.page import render_run
from stare_lab.viewer.selection import top_tokens

TEXT = "naïve 中文 ok, naïve 中文"


@pytest.fixture(scope="module")
def tok():
    """A GPT-2-style byte-level BPE with few merges: 'ï' (2 bytes) and '中' (3 bytes) stay split."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(
        ["the answer is ok", "naive ok"] * 20,
        trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False),
    )
    return PreTrainedTokenizerFast(tokenizer_object=t)


def test_pieces_of_a_split_character_carry_their_bytes(tok):
    ids = tok(TEXT)["input_ids"]
    assert tok.decode(ids) == TEXT
    pieces, byte_pieces = token_pieces(tok, torch.tensor([ids]))
    assert any("\ufffd" in p for p in pieces.values())  # what the page used to show
    zhong = [i for i in set(ids) if i in byte_pieces and byte_pieces[i][1] in ("中".encode()[:1], "中".encode()[1:2])]
    assert zhong, byte_pieces
    # every partial piece's bytes are what the tokenizer's own vocabulary says, e.g. 'ä¸' -> e4 b8
    for i, (raw, data) in byte_pieces.items():
        assert tok.convert_ids_to_tokens(i) == raw and piece_bytes(raw) == data and len(data) == 1
    assert piece_bytes("<0xE2>") == b"\xe2" and piece_bytes("▁the") is None
    assert b"".join(bytes(piece_bytes(tok.convert_ids_to_tokens(i))) for i in ids).decode() == TEXT


def _kept_run(tmp_path, tok):
    ids = tok(TEXT)["input_ids"]
    T = len(ids)
    pieces, byte_pieces = token_pieces(tok, torch.tensor([ids]))
    save_batch(
        batch_path(tmp_path, 0),
        0,
        completion_ids=torch.tensor([ids, ids]),
        mask=torch.ones(2, T),
        rewards=torch.tensor([1.0, 0.0]),
        advantages=torch.tensor([1.0, -1.0]),
        group=torch.tensor([0, 0]),
        stats={"logp": -torch.rand(2, T), "entropy": torch.rand(2, T)},
        token_pieces=pieces,
        byte_pieces=byte_pieces,
        prompts=["p", "p"],
        run_rule={"name": "full", "params": {}},
    )
    return ids, byte_pieces


def test_a_row_decodes_to_its_text_one_token_at_a_time(tmp_path, tok):
    ids, byte_pieces = _kept_run(tmp_path, tok)
    batch = load_batch(batch_path(tmp_path, 0))
    texts = batch.token_pieces(0)
    assert "".join(texts) == TEXT and not any("\ufffd" in t for t in texts)
    for i, text in zip(ids, texts, strict=True):
        if i in byte_pieces and text:  # the token that completes a character shows the whole character
            assert text in ("ï", "中", "文"), (i, text)
    # with these few merges each multi-byte character is one token per byte: all but its last are empty
    assert texts.count("") == sum(len(c.encode()) - 1 for c in TEXT) == 10
    labels = [label for label, _, _ in top_tokens(batch, batch.mask > 0, k=len(set(ids)))]
    assert not any("\ufffd" in label for label in labels)
    raw, data = next(iter(byte_pieces.values()))
    assert f"{raw} ({data.hex(' ')})" in labels


@pytest.mark.skipif(chromium_path() is None, reason="headless Chromium is not installed: apt-get install -y chromium")
def test_the_page_shows_the_decoded_characters(tmp_path, tok):
    _kept_run(tmp_path, tok)
    page = render_run(tmp_path, out=tmp_path / "page.html")
    dom = dump_dom(page)
    first = dom.split('class="tokens">', 1)[1].split("</div>", 1)[0]  # the first rollout's token spans
    spans = re.findall(r'<span class="tok[^"]*"[^>]*>([^<]*)</span>', first)
    assert "".join(html.unescape(s) for s in spans) == TEXT and len(spans) == len(tok(TEXT)["input_ids"])
    data = json.loads(page.read_text().split('<script id="data" type="application/json">')[1].split("</script>")[0])
    assert data["arms"][0]["byte_pieces"]
