r"""Loaders, `\boxed{}` extraction, and math_reward on the real benchmark answers."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest

from stare_lab.config.run_config import BENCHMARK_DATA_DIR
from stare_lab.tasks import build_task, extract_boxed, load_records, math_reward
from stare_lab.tasks.math import MATH_TEMPLATE, MathTask, build_prompt, repair_latex_escapes


def _benchmark_dir() -> Path | None:
    """The benchmark copies shipped in the package (the same files as ../shared/data/benchmarks,
    checked by sha256 in tests/test_wheel.py); $STARE_LAB_BENCHMARKS points elsewhere."""
    for candidate in (os.environ.get("STARE_LAB_BENCHMARKS"), BENCHMARK_DATA_DIR):
        if candidate and Path(candidate, "aime24.jsonl").is_file():
            return Path(candidate)
    return None


BENCH = _benchmark_dir()
needs_bench = pytest.mark.skipif(
    BENCH is None, reason=f"benchmark files absent: {BENCHMARK_DATA_DIR} (or $STARE_LAB_BENCHMARKS)"
)


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (BENCH / f"{name}.jsonl").read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------- loaders
@pytest.fixture
def files(tmp_path):
    rows = [{"question": "1+1?", "sol": "2", "uid": "a"}, {"question": "2+2?", "sol": 4.0, "uid": "b"}]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{**r, "sol": str(r["sol"])} for r in rows]), parquet)
    return jsonl, parquet


@pytest.mark.parametrize("which", [0, 1])
def test_load_records_maps_fields(files, which):
    records = load_records(str(files[which]), fields={"problem": "question", "answer": "sol", "id": "uid"})
    assert [r["problem"] for r in records] == ["1+1?", "2+2?"]
    assert [r["problem_id"] for r in records] == ["a", "b"]
    assert records[0]["answer"] == "2"
    assert records[1]["answer"] in {"4", "4.0"}  # JSON float 4.0 → "4"; the parquet copy stores "4.0"


def test_load_records_default_ids_candidates_and_limit(files):
    records = load_records(str(files[0]), fields={"problem": ["problem", "question"], "answer": "sol"}, limit=1)
    assert records == [{"problem": "1+1?", "answer": "2", "problem_id": "0"}]
    assert load_records(str(files[0]), fields={"problem": "question", "answer": "sol"})[1]["answer"] == "4"


def test_load_records_missing_field_names_it_and_lists_columns(files):
    with pytest.raises(ValueError, match=r"'answer'.*columns present: \['question', 'sol', 'uid'\]"):
        load_records(str(files[1]), fields={"problem": "question", "answer": "answer"})


def test_load_records_missing_file_names_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_records(str(missing))


# -------------------------------------------------------------------------------- extraction
@pytest.mark.parametrize(
    "text, expected",
    [
        (r"first \boxed{1} then \boxed{\frac{a}{b^{2}}}.", r"\frac{a}{b^{2}}"),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
        (r"answer: \fbox{42}", "42"),
        (r"so $\boxed 7$", "7"),
        (r"truncated \boxed{\frac{1}{2}", None),
        (r"empty \boxed{}", None),
        ("no box at all: 5", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_prompt_template_and_aime25_repair():
    assert (
        build_prompt("What is 1+1?")
        == "What is 1+1?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    broken = "Find $\x0crac{m}{n}$ in $\triangle DEF$; code:\n{\n\treturn x;\n} have\tequal"
    fixed = repair_latex_escapes(broken)
    assert fixed == "Find $\\frac{m}{n}$ in $\\triangle DEF$; code:\n{\n\treturn x;\n} have\tequal"


# ------------------------------------------------------------------------------ math_reward
def test_math_reward_hand_cases():
    completions = [r"... so \boxed{\frac{14}{3}}", r"\boxed{14/3}", r"\boxed{5}", "14/3", r"\boxed{C}", r"\boxed{x^2}"]
    golds = [r"\frac{14}{3}", r"\frac{14}{3}", r"\frac{14}{3}", r"\frac{14}{3}", r"\text{(C)}", r"\text{(C)}"]
    assert math_reward(completions, golds) == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    # MATH-500 money answers hold an escaped dollar: it must not be read as a math delimiter
    assert math_reward([r"\boxed{36}", r"\boxed{37}", r"\boxed{32348}"], [r"\$36", r"\$36", r"\$32,\!348"]) == [
        1.0,
        0.0,
        1.0,
    ]
    assert math_reward(
        [r"\boxed{\frac{1}{0}", None, [{"role": "assistant", "content": r"\boxed{3}"}]], ["x", "1", "3"]
    ) == [0.0, 0.0, 1.0]


def _perturb(answer: str, others: list[str], i: int) -> str:
    if re.fullmatch(r"-?\d+", answer.strip()):
        return str(int(answer) + 1)
    j = (i + 1) % len(others)  # the next non-integer answer that differs as a string
    while others[j].replace(" ", "") == answer.replace(" ", "") or re.fullmatch(r"-?\d+", others[j].strip()):
        j = (j + 1) % len(others)
    return others[j]


@needs_bench
@pytest.mark.parametrize("name", ["aime24", "aime25", "amc23", "math500"])
def test_math_reward_on_real_gold_answers(name):
    golds = [r["answer"] for r in _rows(name)]
    right = math_reward([f"Reasoning... so the answer is $\\boxed{{{g}}}$." for g in golds], golds)
    wrong = [_perturb(g, golds, i) for i, g in enumerate(golds)]
    wrong_scores = math_reward([f"\\boxed{{{w}}}" for w in wrong], golds)
    unboxed = math_reward([f"The answer is {g}." for g in golds], golds)
    failures = [(i, g) for i, (g, s) in enumerate(zip(golds, right, strict=True)) if s != 1.0]
    false_pos = [(i, g, w) for i, (g, w, s) in enumerate(zip(golds, wrong, wrong_scores, strict=True)) if s != 0.0]
    assert len(failures) <= 0.02 * len(golds), f"{name}: boxed gold answers not verified: {failures}"
    assert not false_pos, f"{name}: perturbed answers verified: {false_pos}"
    assert sum(unboxed) == 0.0


def test_math_reward_off_main_thread():
    result = {}
    worker = threading.Thread(
        target=lambda: result.update(r=math_reward([r"\boxed{\frac{1}{2}}", r"\boxed{3}"], ["0.5", "4"]))
    )
    worker.start()
    worker.join(timeout=30)
    assert result.get("r") == [1.0, 0.0]


# ---------------------------------------------------------------------------------- the task
def test_math_task_from_files(files):
    task = build_task(
        {
            "name": "math",
            "train_source": str(files[0]),
            "heldout_source": str(files[1]),
            "fields": {"problem": "question", "answer": "sol", "id": "uid"},
        }
    )
    assert isinstance(task, MathTask) and task.name == "math"
    train = task.train_dataset()
    assert train.column_names == ["prompt", "answer", "problem_id"]
    assert train[0]["prompt"] == MATH_TEMPLATE.replace("{problem}", "1+1?")
    assert task.heldout_dataset()["problem_id"] == ["a", "b"]
    assert task.reward([r"\boxed{2}", r"\boxed{5}"], answer=["2", "4"], prompts=None) == [1.0, 0.0]
    assert task.extract(r"\boxed{2}") == "2" and task.verify(r"\boxed{4}", "4")
    chat = MathTask(str(files[0]), chat=True, fields={"problem": "question", "answer": "sol"}).train_dataset()
    assert chat[0]["prompt"][0]["role"] == "user"


def test_build_task_rejects_unknown_names_and_keys():
    with pytest.raises(ValueError, match=r"'nope'.*\['arithmetic', 'math', 'reasoning_gym'\]"):
        build_task({"name": "nope"})
    with pytest.raises(ValueError, match="task.bogus"):
        build_task({"name": "math", "bogus": 1})


@needs_bench
def test_benchmark_configs_read_local_copies_and_prompts_are_repaired():
    from stare_lab.evaluation import load_benchmark

    for name, rows in (("aime24", 30), ("aime25", 30), ("amc23", 40), ("math500", 500)):
        got, records, settings = load_benchmark(name, source_override=str(BENCH / f"{name}.jsonl"))
        assert got == name and len(records) == rows and records[0]["problem_id"] == "0"
    prompts = [build_prompt(r["problem"]) for r in load_benchmark("aime25", str(BENCH / "aime25.jsonl"))[1]]
    assert not any("\x0c" in p for p in prompts)
    assert "\\frac{m}{n}" in prompts[27] and "\\triangle DEF" in prompts[19]
