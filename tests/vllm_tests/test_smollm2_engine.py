"""vLLM reads the converted SmolLM2-135M-Instruct folder (`model=smollm2`, docs/models.md) as it is: the
engine this environment builds on it (transformers 5.17 here, the folder written by 5.24) continues a
plain prompt and a chat prompt greedily with the tokens transformers picks on the same folder."""

from __future__ import annotations

import pytest
import torch

from stare_lab.models import load_model_and_tokenizer
from stare_lab.training.vllm_engine import build_llm

pytestmark = pytest.mark.vllm

NEW = 8
KV_BYTES = (
    256 << 20
)  # SmolLM2 in fp32: 2 x 30 layers x 3 KV heads x 64 x 4 B = 45 KiB a token, 22.5 MiB a 512-token sequence


def test_vllm_continues_smollm2_as_transformers_does(smollm2_folder):
    from vllm import SamplingParams

    model, tok = load_model_and_tokenizer("smollm2")
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    prompts = ["The capital of France is", chat]
    # An explicit KV-cache size: vLLM's CPU worker otherwise sizes the cache as a share of the node's memory
    # minus this process's RSS, and inside the vLLM suite (earlier tests' engines and models alive in
    # the same process) that difference was negative on CI's 23.5 GiB machine.
    llm = build_llm(
        str(smollm2_folder),
        dtype="float32",
        cpu=True,
        kv_cache_memory_bytes=KV_BYTES,
        max_model_len=512,
        enforce_eager=True,
    )
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            want = model.generate(**ids, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)[
                0, ids.input_ids.size(1) :
            ]
        assert list(out.outputs[0].token_ids) == want.tolist(), (prompt, out.outputs[0].text, tok.decode(want))
    assert outs[0].outputs[0].text.startswith(" Paris")
