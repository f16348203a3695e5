"""The parity harness itself (tests/trl_vendor), checked without TRL's suite: the stand-in datasets have
zen's columns and splits, a stand-in model resolves offline by its hub id, and the substituted
`GRPOTrainer` is ours with rule `full` (TRL's suite itself: tests/trl_vendor/test_trl_grpo.py, slow)."""

from __future__ import annotations

import types

import pytest
import standins
import upstream


def test_standin_datasets_have_zen_columns_and_splits():
    standard = standins.load_dataset("trl-internal-testing/zen", "standard_prompt_only")
    assert set(standard) == {"train", "test"} and standard["train"].column_names == ["prompt"]
    assert standard["train"][0]["prompt"] == "Beautiful is better than" and len(standard["train"]) == 17
    chat = standins.load_dataset("trl-internal-testing/zen", "conversational_prompt_only", split="train")
    assert chat[0]["prompt"] == [{"role": "user", "content": "Beautiful is better than"}]
    images = standins.load_dataset("trl-internal-testing/zen-image", "conversational_prompt_only", split="train")
    assert images[0]["image"].size == (32, 32) and images[0]["prompt"][0]["content"][0] == {
        "type": "image",
        "text": None,
    }
    streamed = standins.load_dataset("trl-internal-testing/zen", "standard_prompt_only", split="test", streaming=True)
    assert [r["prompt"] for r in streamed] == standins.TEST_PROMPTS
    with pytest.raises(FileNotFoundError, match="no local stand-in"):
        standins.load_dataset("trl-lib/Capybara")


def test_standin_model_resolves_offline_by_hub_id(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setattr(standins, "STANDINS", {k: v for k, v in standins.STANDINS.items() if "Qwen3ForCausalLM" in k})
    assert standins.build_hub_cache(tmp_path) == {}
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    model = AutoModelForCausalLM.from_pretrained("trl-internal-testing/tiny-Qwen3ForCausalLM")
    tok = AutoTokenizer.from_pretrained("trl-internal-testing/tiny-Qwen3ForCausalLM")
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.vocab_size == len(tok)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok("Hi there").input_ids) == "Hi there"


def test_substituted_trainer_is_ours_with_rule_full(tmp_path):
    from fixtures_trainer import cpu_config

    from stare_lab.models.builtin import build_model, build_tokenizer
    from stare_lab.tasks.arithmetic import ArithmeticTask
    from stare_lab.training.trainer import TokenRuleGRPOTrainer

    suite = types.SimpleNamespace(GRPOTrainer=None, load_dataset=None)
    upstream.substitute(suite, "ours")
    assert issubclass(suite.GRPOTrainer, TokenRuleGRPOTrainer) and suite.GRPOTrainer.__name__ == "GRPOTrainer"
    tok = build_tokenizer()
    args = cpu_config(tmp_path, per_device_train_batch_size=2, num_generations=2)
    trainer = suite.GRPOTrainer(
        model=build_model(tok, hidden_size=16, num_layers=1, intermediate_size=32),
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=ArithmeticTask(train_size=4, heldout_size=2).train_dataset(),
        processing_class=tok,
    )
    assert trainer.rule.name == "full"
    assert suite.load_dataset is standins.load_dataset
    plain = types.SimpleNamespace(GRPOTrainer="trl's", load_dataset=None)
    upstream.substitute(plain, "plain")
    assert plain.GRPOTrainer == "trl's"


def test_missing_checkout_is_a_skip_with_the_reason(tmp_path):
    reason = upstream.why_not_runnable(tmp_path)
    assert "STARE_TRL_TESTS" in reason and "ORIGIN.md" in reason
