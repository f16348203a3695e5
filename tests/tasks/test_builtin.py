"""The arithmetic task, the shipped built-in model and the model loader."""

from __future__ import annotations

import pytest
import torch

from stare_lab.models import BUILTIN_DIR, load_model_and_tokenizer
from stare_lab.models.builtin import build_tokenizer
from stare_lab.models.train_builtin import heldout_accuracy, heldout_profile, procedure_of
from stare_lab.tasks.arithmetic import ArithmeticTask, left_to_right, solution


@pytest.fixture(scope="module")
def builtin():
    return load_model_and_tokenizer("builtin")


# --- task ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, answer, ok",
    [
        ("48*2=96;37+96=133#", "133", True),  # the reference format
        ("48*2=96;37+96=133#133", "133", True),  # text after '#' is ignored
        ("37+96=133#", "133", True),  # skipping the first step is not penalised
        ("48*2=96;37+96=0133#", "133", True),  # numeric comparison
        ("48*2=96;37+96=134#", "133", False),  # wrong answer
        ("48*2=96;37+96=133", "133", False),  # no terminating '#'
        ("133#", "133", False),  # no '=' before the answer
        ("48*2=96;37+96=#133", "133", False),  # empty answer
        ("48*2=96;37+96=13 3#", "133", False),  # not a number
        ("48*2=133;37+96=96#", "133", False),  # the right number in the wrong place
        ("", "133", False),
    ],
)
def test_verifier_by_hand(completion, answer, ok):
    assert ArithmeticTask.verify(completion, answer) is ok


def test_extract_and_reward():
    task = ArithmeticTask(train_size=10, heldout_size=10)
    assert task.extract("48*2=96;37+96=133#") == "133"
    assert task.extract("48*2=96;37+96=133") is None
    # TRL's calling convention: keyword arguments, extra columns and state passed through.
    rewards = task.reward(
        prompts=["37+48*2="] * 3,
        completions=["48*2=96;37+96=133#", "x", "=134#"],
        answer=["133"] * 3,
        completion_ids=[[1]] * 3,
        trainer_state=None,
        problem_id=["37+48*2"] * 3,
    )
    assert rewards == [1.0, 0.0, 0.0]


def test_reference_solutions_verify():
    assert solution(37, 48, 2) == "48*2=96;37+96=133#"
    rows = ArithmeticTask(train_size=300, heldout_size=50).train_dataset()
    for row in rows:
        a, rest = row["problem_id"].split("+")
        b, c = rest.split("*")
        assert int(row["answer"]) == int(a) + int(b) * int(c)
        assert row["prompt"] == row["problem_id"] + "="
        assert ArithmeticTask.verify(row["solution"], row["answer"])
        assert len(row["solution"]) <= 24


def test_left_to_right_is_never_right():
    assert left_to_right(37, 4, 6) == "37+4=41;41*6=246#"
    assert procedure_of("37+4=41;41*6=246#", "37+4*6") == "left_to_right"
    assert procedure_of("4*6=24;37+24=61#", "37+4*6") == "correct"
    assert procedure_of("61#", "37+4*6") == "other"
    for row in ArithmeticTask(train_size=4000, heldout_size=200).train_dataset():
        a, rest = row["problem_id"].split("+")
        b, c = rest.split("*")
        assert not ArithmeticTask.verify(left_to_right(int(a), int(b), int(c)), row["answer"])


def test_splits_disjoint_and_deterministic():
    a = ArithmeticTask(train_size=4000, heldout_size=200, seed=0)
    b = ArithmeticTask(train_size=4000, heldout_size=200, seed=0)
    c = ArithmeticTask(train_size=4000, heldout_size=200, seed=1)
    train, heldout = a.train_dataset(), a.heldout_dataset()
    assert len(train) == 4000 and len(heldout) == 200
    assert len(set(train["problem_id"])) == 4000 and len(set(heldout["problem_id"])) == 200
    assert train.to_dict() == b.train_dataset().to_dict()
    assert heldout.to_dict() == b.heldout_dataset().to_dict()
    # The held-out split is fixed across seeds; the train split is not, and never overlaps it.
    assert heldout.to_dict() == c.heldout_dataset().to_dict()
    assert train["problem_id"] != c.train_dataset()["problem_id"]
    for split in (train, c.train_dataset()):
        assert not set(split["problem_id"]) & set(heldout["problem_id"])


# --- built-in model -------------------------------------------------------------------------


def test_builtin_is_small_qwen2_with_gqa(builtin):
    model, tokenizer = builtin
    size = sum(f.stat().st_size for f in BUILTIN_DIR.iterdir() if f.is_file())
    assert size < 10 * 2**20
    assert model.config.model_type == "qwen2"
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_builtin_heldout_accuracy_at_t1_is_mixed(builtin):
    model, tokenizer = builtin
    task = ArithmeticTask()
    problems = task.heldout_dataset().select(range(64))
    acc = heldout_accuracy(model, tokenizer, task, problems, sample=True, seed=0)
    assert 0.15 <= acc <= 0.85, acc


def test_builtin_forks_between_procedures_and_executes_them(builtin):
    """The testbed's design (train_builtin): the procedure is chosen at random, then carried out well."""
    model, tokenizer = builtin
    task = ArithmeticTask()
    profile = heldout_profile(model, tokenizer, task, task.heldout_dataset(), seed=0)
    assert 0.2 <= profile["share_correct"] <= 0.6, profile
    assert profile["share_other"] <= 0.1, profile
    assert profile["exec_acc"] >= 0.85, profile
    # the first completion token chooses the procedure: its entropy is high, the arithmetic's low
    enc = tokenizer(["37+4*6="], return_tensors="pt")
    with torch.no_grad():
        logp = model(**enc).logits[0, -1].log_softmax(-1)
    assert -(logp.exp() * logp).sum() >= 0.5


def test_builtin_generation_stops_at_eos(builtin):
    model, tokenizer = builtin
    enc = tokenizer(["37+4*6=", "15+3*9="], return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=False, max_new_tokens=24)
    new = out[:, enc["input_ids"].shape[1] :]
    assert (new == tokenizer.eos_token_id).any(dim=1).all()
    text = tokenizer.batch_decode(new, skip_special_tokens=True)
    assert all(t.endswith("#") for t in text), text


@pytest.mark.parametrize("text", ["37+48*2=", "48*2=96;37+96=133#", "Hello, world!\n  x = (a-b)/2"])
def test_tokenizer_round_trips(builtin, text):
    _, tokenizer = builtin
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no BOS
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids + [tokenizer.eos_token_id, tokenizer.pad_token_id], skip_special_tokens=True) == text
    assert build_tokenizer()(text)["input_ids"] == ids


def test_lora_wraps_with_fewer_trainable_params():
    model, _ = load_model_and_tokenizer(
        "builtin", lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    )
    from peft import PeftModel

    assert isinstance(model, PeftModel)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert 0 < trainable < total
    with pytest.raises(ValueError, match="rank"):
        load_model_and_tokenizer("builtin", lora={"rank": 4})


def test_local_path_round_trip(builtin, tmp_path):
    from transformers import AutoTokenizer

    model, tokenizer = builtin
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model2, tokenizer2 = load_model_and_tokenizer(str(tmp_path))
    ids = tokenizer2(["37+48*2="], return_tensors="pt")
    assert ids["input_ids"].tolist() == tokenizer(["37+48*2="], return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, model2(**ids).logits)
    # Plain AutoTokenizer (which transformers 5 maps to Qwen2Tokenizer here) agrees too.
    text = "a b\n48*2=96;"
    assert AutoTokenizer.from_pretrained(tmp_path)(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_missing_local_path_is_a_clear_error(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(ValueError, match="nope"):
        load_model_and_tokenizer(missing)
    with pytest.raises(ValueError, match="does-not-exist"):
        load_model_and_tokenizer("./does-not-exist")
