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


def test_vllm_continues_smollm2_as_transformers_does(smollm2_folder):
    from vllm import SamplingParams

    model, tok = load_model_and_tokenizer("smollm2")
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    prompts = ["The capital of France is", chat]
    llm = build_llm(str(smollm2_folder), dtype="float32", cpu=True, gpu_memory_utilization=0.1, max_model_len=512)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            want = model.generate(**ids, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)[
                0, ids.input_ids.size(1) :
            ]
        assert list(out.outputs[0].token_ids) == want.tolist(), (prompt, out.outputs[0].text, tok.decode(want))
    assert outs[0].outputs[0].text.startswith(" Paris")
