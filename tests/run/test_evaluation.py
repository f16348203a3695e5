"""pass@k against brute force, avg@n / maj@n / bootstrap by hand, and an end-to-end evaluation."""

from __future__ import annotations

import importlib.util
import itertools
import json
import string

import numpy as np
import pandas as pd
import pytest

from stare_lab.evaluation import (
    PARQUET_COLUMNS,
    VERIFIERS,
    avg_at_n,
    bootstrap_ci,
    evaluate_benchmark,
    generate_samples,
    list_benchmarks,
    load_benchmark,
    maj_at_k,
    pass_at_k,
    summarize,
)


# ----------------------------------------------------------------------------------- pass@k
def _pass_at_k_brute(n: int, c: int, k: int) -> float:
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_enumeration_of_k_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_brute(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_cases_and_arrays():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 3 of the 6 pairs hold the correct sample
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 2) != pytest.approx(1 - (1 - 1 / 4) ** 2)  # the biased estimate: 0.4375
    out = pass_at_k(np.array([4, 5, 8]), np.array([1, 0, 3]), 2)
    assert isinstance(out, np.ndarray) and out.shape == (3,)
    np.testing.assert_allclose(out, [0.5, 0.0, _pass_at_k_brute(8, 3, 2)])


@pytest.mark.parametrize("n, c, k", [(4, 1, 5), (4, 5, 2), (4, -1, 2), (4, 1, 0)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


# ----------------------------------------------------------------------- avg@n, maj, bootstrap
def _records(correct_counts=(4, 2, 0), n=4):
    # problem p0: "5" ×4 (all right); p1: 8 7 7 9 (the two 7s right); p2: 1 1 - 2 (all wrong)
    extracted = {"p0": ["5"] * 4, "p1": ["8", "7", "7", "9"], "p2": ["1", "1", None, "2"]}
    rows = []
    for (pid, answers), c in zip(extracted.items(), correct_counts, strict=True):
        right = [a == "5" for a in answers] if pid == "p0" else [a == "7" for a in answers]
        assert sum(right) == c
        rows += [
            {"problem_id": pid, "sample_index": j, "extracted": a, "correct": r}
            for j, (a, r) in enumerate(zip(answers, right, strict=True))
        ]
    return pd.DataFrame(rows)


def test_avg_at_n_matrix_and_records():
    matrix = [[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]]
    assert avg_at_n(matrix) == pytest.approx(0.5)  # (1 + 0.5 + 0) / 3
    assert avg_at_n(_records()) == pytest.approx(0.5)
    assert avg_at_n(_records().to_dict("records")) == pytest.approx(0.5)
    # per problem first: 2 problems, one with 1/1 and one with 0/3 → 0.5, not 1/4
    uneven = pd.DataFrame({"problem_id": ["a", "b", "b", "b"], "correct": [True, False, False, False]})
    assert avg_at_n(uneven) == pytest.approx(0.5)


def test_maj_at_k_votes_and_ties():
    assert maj_at_k(_records(), 4) == pytest.approx(2 / 3)  # p0 "5" right, p1 "7" right, p2 "1" wrong
    df = pd.DataFrame(
        {
            "problem_id": ["q"] * 4,
            "sample_index": [0, 1, 2, 3],
            "extracted": ["7", "8", "8 ", "8"],
            "correct": [True, False, False, False],
        }
    )
    assert maj_at_k(df) == 0.0  # majority "8" (whitespace ignored) is wrong
    assert maj_at_k(df, k=1) == 1.0  # only sample 0 votes
    assert maj_at_k(df, k=2) == 1.0  # a 1-1 tie goes to the answer seen first


def test_bootstrap_ci():
    values = [1.0, 0.5, 0.0]
    lo, hi = bootstrap_ci(values, n_boot=2000, seed=0)
    assert lo <= np.mean(values) <= hi and lo < hi
    assert 0.0 <= lo and hi <= 1.0
    assert bootstrap_ci(values, n_boot=2000, seed=0) == (lo, hi)
    assert bootstrap_ci([0.25] * 5, seed=3) == (0.25, 0.25)


def test_summarize_small_frame():
    metrics = summarize(_records(), 4)
    assert set(metrics) == {"avg@4", "avg@4_ci", "pass@1", "pass@2", "pass@4", "maj@4"}
    assert metrics["avg@4"] == pytest.approx(0.5)
    assert metrics["pass@1"] == pytest.approx(0.5)
    assert metrics["pass@2"] == pytest.approx((1 + 5 / 6 + 0) / 3)  # p1: 1 - C(2,2)/C(4,2)
    assert metrics["pass@4"] == pytest.approx(2 / 3)
    assert metrics["maj@4"] == pytest.approx(2 / 3)
    lo, hi = metrics["avg@4_ci"]
    assert lo <= 0.5 <= hi
    with pytest.raises(ValueError, match="expected n=8"):
        summarize(_records(), 8)


# ------------------------------------------------------------------------- tiny model, e2e
@pytest.fixture(scope="module")
def tiny_lm():
    import torch
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    chars = sorted(set(string.printable) - set("\r\x0b\x0c"))
    vocab = {"<pad>": 0, "<eos>": 1, **{ch: i + 2 for i, ch in enumerate(chars)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config), tokenizer


def test_generate_samples_shapes_and_seed(tiny_lm):
    model, tok = tiny_lm
    a = generate_samples(
        model, tok, ["1+1=", "22+3="], n=3, temperature=1.0, top_p=0.7, max_tokens=5, batch_size=4, seed=1
    )
    b = generate_samples(
        model, tok, ["1+1=", "22+3="], n=3, temperature=1.0, top_p=0.7, max_tokens=5, batch_size=4, seed=1
    )
    assert a == b and [len(s) for s in a] == [3, 3]
    assert all(isinstance(t, str) and 1 <= L <= 5 for s in a for t, L in s)
    assert tok.padding_side == "right"  # restored


def test_generate_samples_length_stops_at_eos(tiny_lm):
    import torch

    _, tok = tiny_lm

    class Scripted(torch.nn.Module):  # emits "4", "2", EOS, then padding
        generation_config = type("G", (), {"eos_token_id": 1})()

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def generate(self, input_ids, attention_mask, **kwargs):
            tail = torch.tensor(tok.convert_tokens_to_ids(["4", "2"]) + [1, 0, 0]).expand(len(input_ids), -1)
            return torch.cat([input_ids, tail], dim=1)

    out = generate_samples(Scripted(), tok, ["x"], n=2, max_tokens=5, batch_size=8, seed=0)
    assert out == [[("42", 3), ("42", 3)]]


def test_evaluate_benchmark_writes_run_record(tiny_lm, tmp_path):
    model, tok = tiny_lm
    records = [{"problem_id": f"p{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(3)]
    result = evaluate_benchmark(
        model,
        tok,
        "math_verify",
        records,
        n=4,
        temperature=1.0,
        top_p=0.7,
        max_tokens=6,
        batch_size=5,
        seed=0,
        out_dir=tmp_path,
        step=7,
        name="toy",
    )
    key = "step-7_n4_t1_p0.7_m6_math_verify"  # the settings, readable, in the file name
    assert result["settings_key"] == key
    df = pd.read_parquet(tmp_path / "eval" / "toy" / f"{key}.parquet")
    assert tuple(df.columns) == PARQUET_COLUMNS and len(df) == 12
    assert df.groupby("problem_id")["sample_index"].apply(sorted).tolist() == [[0, 1, 2, 3]] * 3
    assert df["correct"].dtype == bool and df["length"].between(1, 6).all()
    assert set(df["gold"]) == {"1", "2", "3"}
    written = json.loads((tmp_path / "eval" / "toy" / f"{key}.json").read_text())
    assert written == result
    assert list(written) == [
        "benchmark",
        "step",
        "final",
        "n",
        "temperature",
        "top_p",
        "max_tokens",
        "verifier",
        "engine",
        "num_problems",
        "metrics",
        "settings_key",
    ]
    assert (written["benchmark"], written["step"], written["n"], written["verifier"], written["num_problems"]) == (
        "toy",
        7,
        4,
        "math_verify",
        3,
    )
    assert written["metrics"] == summarize(df, 4)  # floats survive the JSON round trip exactly
    assert not list((tmp_path / "eval").rglob(".*tmp*"))


def test_evaluate_benchmark_uses_task_verify(tiny_lm, tmp_path):
    model, tok = tiny_lm

    class EvenLength:  # a stand-in task: "correct" when the completion has an even length
        name = "stub"

        def extract(self, text):
            return text[:1] or None

        def verify(self, text, answer):
            return len(text) % 2 == 0

    records = [
        {"problem_id": "a", "prompt": "12+3=", "answer": "15"},
        {"problem_id": "b", "prompt": "4+4=", "answer": "8"},
    ]
    result = evaluate_benchmark(
        model,
        tok,
        EvenLength(),
        records,
        n=4,
        max_tokens=5,
        batch_size=8,
        seed=2,
        out_dir=tmp_path,
        step=3,
        name="stub",
        intermediate=True,
    )
    df = pd.read_parquet(tmp_path / "eval" / "stub" / f"{result['settings_key']}.parquet")
    assert (
        result["verifier"] == "exact" and result["final"] is False and result["settings_key"].startswith("step-3_n4_")
    )
    assert df["correct"].tolist() == [len(t) % 2 == 0 for t in df["answer"]]
    assert result["metrics"]["avg@4"] == pytest.approx(df["correct"].mean())


# ------------------------------------------------------------------------------- benchmarks
def test_benchmark_configs_are_complete():
    names = list_benchmarks()
    assert {"aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench", "gsm8k", "arithmetic"} <= set(names)
    from omegaconf import OmegaConf

    from stare_lab.evaluation import BENCHMARK_DIRS

    for path in (d / f"{n}.yaml" for d in BENCHMARK_DIRS for n in names if (d / f"{n}.yaml").is_file()):
        cfg = OmegaConf.to_container(OmegaConf.load(path))
        assert cfg["name"] == path.stem and cfg["verifier"] in set(VERIFIERS) and cfg["n"] in {4, 32}
        assert cfg["source"]
    with pytest.raises(ValueError, match="known:"):
        load_benchmark("nope")


def test_load_benchmark_with_local_override(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "How many?", "answer": "3 + 997 = 1,000\n#### 1,000"}) + "\n")
    name, records, settings = load_benchmark("gsm8k", source_override=str(path))
    assert name == "gsm8k" and settings["verifier"] == "math_verify" and settings["source"] == str(path)
    assert records == [{"problem": "How many?", "answer": "1000", "problem_id": "0"}]
    name, records, settings = load_benchmark(
        {
            "name": "t",
            "source": str(path),
            "n": 4,
            "verifier": "math_verify",
            "fields": {"problem": "question", "answer": "answer"},
        }
    )
    assert records[0]["answer"].endswith("#### 1,000") and settings["n"] == 4


@pytest.mark.skipif(
    importlib.util.find_spec("stare_lab.tasks.arithmetic") is None, reason="arithmetic task not built yet"
)
def test_load_benchmark_builtin_arithmetic():
    name, records, settings = load_benchmark("arithmetic")
    assert name == "arithmetic" and settings["verifier"] == "exact" and settings["n"] == 32
    assert records and {"prompt", "answer", "problem_id"} <= set(records[0])
