"""The reasoning_gym task against the library itself (reasoning-gym 0.1.25): on 15 datasets of five
categories our reward is the dataset's own `score_answer` on the library's own entry (1.0 on its answer,
the same value on wrong and partly right answers built here); the splits are disjoint by question text
with the collisions counted; the same seed gives the same problems in a new process; prompts, answer
tags and the chat template; bad input refused in one line before anything launches, without torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import reasoning_gym

from stare_lab.config.run_config import ConfigError, compose
from stare_lab.evaluation import checked_rows, resolve_scorer, summarize
from stare_lab.tasks import build_task
from stare_lab.tasks.reasoning_gym import ReasoningGymTask, heldout_budget, heldout_seed_of

# (dataset, generator config): at least two per category, small configs where the default is slow
DATASETS = {
    "arithmetic": [("basic_arithmetic", {}), ("chain_sum", {}), ("gcd", {})],
    "algorithmic": [("number_sorting", {}), ("spell_backward", {}), ("word_sorting", {})],
    "logic": [("knights_knaves", {"n_people": 2}), ("zebra_puzzles", {"num_people": 3}), ("syllogism", {})],
    "graphs": [("shortest_path", {}), ("family_relationships", {})],
    "games": [("maze", {}), ("mini_sudoku", {}), ("countdown", {}), ("n_queens", {})],
}
CASES = [(cat, name, cfg) for cat, items in DATASETS.items() for name, cfg in items]
HELDOUT = 4


def flip_one(entry: dict) -> str:
    """A knights-and-knaves answer with its first person's role flipped (in the puzzle's own words)."""
    terms = entry["metadata"]["knight_knave_terms"]
    a, b = str(terms["a_knight"]), str(terms["a_knave"])
    first = min((i, x, y) for x, y in ((a, b), (b, a)) if (i := entry["answer"].find(x)) >= 0)
    return entry["answer"].replace(first[1], first[2], 1)


def variants(entry: dict) -> list[str]:
    """Wrong and partly right answers: cut, extended, altered, reordered, emptied, one assignment flipped."""
    answer = entry["answer"]
    out = [answer + " and more", answer[: max(1, len(answer) // 2)], answer[::-1], "", "0", answer + answer[-1:]]
    out += [answer.replace(", ", ",", 1), answer.replace("1", "2", 1), ", ".join(reversed(answer.split(", ")))]
    if "knight_knave_terms" in entry["metadata"]:
        out.append(flip_one(entry))
    return [v for v in dict.fromkeys(out) if v != answer]


def library_entry(name: str, config: dict, problem_id: str) -> dict:
    """The library's own entry of a held-out problem, generated here without the task."""
    index = int(problem_id.rsplit("/", 1)[1])
    generator = reasoning_gym.create_dataset(
        name, **config, seed=heldout_seed_of(name, 20261129), size=heldout_budget(HELDOUT)
    )
    return generator[index]


def scored(name: str, config: dict) -> list[tuple[list[str], list[float], list[float], dict[str, float]]]:
    """Per held-out problem: (answers, our rewards of the tagged answers and of an untagged completion, the
    library's scores of the answers on its own entry, what the reward logged)."""
    task = ReasoningGymTask([{"name": name, "weight": 1.0, "config": config}], heldout_size=HELDOUT, chat=False)
    records = task.benchmark_records(name)
    assert len(records) == HELDOUT and len({r["problem_id"] for r in records}) == HELDOUT
    library = reasoning_gym.create_dataset(name, **config)  # a dataset whose score reads its config: that config
    out = []
    for record in records:
        entry = library_entry(name, config, record["problem_id"])
        assert entry["question"] in record["prompt"] and record["answer"] == entry["answer"]
        answers = [entry["answer"], *variants(entry)]
        completions = [f"Let me think.\n<answer>{a}</answer>" for a in answers] + ["no tags at all"]
        logged: dict[str, float] = {}
        rewards = task.reward(
            completions,
            answer=[record["answer"]] * len(completions),
            problem_id=[record["problem_id"]] * len(completions),
            log_metric=logged.__setitem__,
        )
        out.append((answers, rewards, [library.score_answer(a.strip(), entry) for a in answers], logged))
    return out


@pytest.mark.parametrize("category, name, config", CASES, ids=[c[1] for c in CASES])
def test_the_reward_is_the_datasets_own_score(category, name, config):
    assert ReasoningGymTask.category_of(name) == category
    for answers, rewards, expected, logged in scored(name, config):
        assert rewards[0] == 1.0 and rewards[:-1] == expected, (name, answers, rewards, expected)
        assert rewards[-1] == 0.0 and logged["task/no_answer"] == 1 / len(rewards)
        assert logged[f"task/{name}/score"] == pytest.approx(sum(rewards) / len(rewards))


@pytest.mark.parametrize("name", ["knights_knaves", "basic_arithmetic", "syllogism", "mini_sudoku", "word_sorting"])
def test_partial_credit_is_kept_as_the_dataset_gives_it(name):
    config = dict(next(cfg for _, n, cfg in CASES if n == name))
    values = [r for _, rewards, _, _ in scored(name, config) for r in rewards]
    assert any(0.0 < v < 1.0 for v in values), values


def test_an_answer_without_the_tag_scores_zero_where_the_library_gives_a_format_credit():
    """countdown's score_answer gives 0.01 for no answer; the task's rule is 0 (and counted)."""
    task = ReasoningGymTask([{"name": "countdown", "weight": 1.0, "config": {}}], heldout_size=2, chat=False)
    (record, _) = task.benchmark_records("countdown")
    entry = library_entry("countdown", {}, record["problem_id"])
    assert reasoning_gym.get_score_answer_fn("countdown")(None, entry) == 0.01
    assert task.reward(["I give up"], answer=[record["answer"]], problem_id=[record["problem_id"]]) == [0.0]


def test_train_and_heldout_are_disjoint_and_the_collisions_are_counted():
    # two-term sums of one-digit numbers: a few hundred problems, so the streams collide
    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    mix = [
        {"name": "chain_sum", "weight": 3.0, "config": small},
        {"name": "knights_knaves", "weight": 1.0, "config": {}},
    ]
    task = ReasoningGymTask(mix, train_size=300, heldout_size=40, chat=False)
    train = task.train_rows()
    held = {r["prompt"] for n in task.dataset_names for r in task.benchmark_records(n)}
    assert len(train) == 300 and len(held) == 80 and not {r["prompt"] for r in train} & held
    record = task.split_record()
    # the composite's stream, replayed with the library: every drawn problem is kept or counted as removed
    composite = reasoning_gym.create_dataset(
        "composite",
        seed=0,
        size=4 * 300 + 2 * 80 + 64,
        datasets=[reasoning_gym.composite.DatasetSpec(d["name"], d["weight"], d["config"]) for d in mix],
    )
    last = int(train[-1]["problem_id"].rsplit("/", 1)[1])
    questions = {e["question"] for n in task.dataset_names for _, e in task.heldout_entries(n)}
    removed = sum(composite[i]["question"] in questions for i in range(last + 1))
    assert record["train"]["heldout_collisions_removed"]["chain_sum"] == removed > 0
    assert record["train"]["heldout_collisions_removed"]["knights_knaves"] == 0
    assert sum(record["train"]["per_dataset"].values()) == 300 == last + 1 - removed
    assert record["heldout"]["chain_sum"]["duplicates_skipped"] > 0  # a held-out set has no repeated question
    # the held-out problems do not depend on the training seed or on the other datasets of the mix
    alone = ReasoningGymTask([mix[1]], seed=7, heldout_size=40, chat=False)
    assert alone.benchmark_records("knights_knaves") == task.benchmark_records("knights_knaves")


SNAPSHOT = """
    import json, sys
    from stare_lab.tasks.reasoning_gym import ReasoningGymTask
    mix = [{"name": n, "weight": w, "config": {}} for n, w in (("knights_knaves", 2.0), ("maze", 1.0), ("gcd", 1.0))]
    task = ReasoningGymTask(mix, train_size=40, heldout_size=5, seed=int(sys.argv[1]), chat=False)
    rows = task.train_rows() + [r for n in task.dataset_names for r in task.benchmark_records(n)]
    print(json.dumps([(r["problem_id"], r["prompt"], r["answer"]) for r in rows]))
"""


def snapshot(seed: int) -> list:
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SNAPSHOT), str(seed)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_the_same_seed_gives_the_same_problems_in_a_new_process():
    first, again, other = snapshot(3), snapshot(3), snapshot(4)
    assert first == again and len(first) == 40 + 15
    assert [r[1] for r in first[:40]] != [r[1] for r in other[:40]]  # another seed: other training problems
    assert first[40:] == other[40:]  # the held-out problems stay


def test_prompts_follow_the_template_the_tag_and_the_chat_template():
    cfg = {"name": "reasoning_gym", "datasets": [{"name": "gcd", "weight": 1.0, "config": {}}], "train_size": 2}
    task = build_task({**cfg, "answer_tag": "final", "heldout_size": 1})
    task.bind_chat(True)
    (row,) = task.benchmark_records("gcd")
    assert row["prompt"][-1]["role"] == "user" and "<final> and </final>" in row["prompt"][-1]["content"]
    assert task.extract("<final>3</final> or <final> 4 </final>") == "4"  # the last tag, stripped
    assert task.extract("<answer>4</answer>") is None
    plain = build_task({**cfg, "heldout_size": 1, "chat": "auto", "system_prompt": "Be brief."})
    plain.bind_chat(False)  # a model without a chat template: plain text
    (row,) = plain.benchmark_records("gcd")
    assert isinstance(row["prompt"], str) and row["prompt"].startswith("Be brief.\n\nFind the Greatest Common")
    with pytest.raises(RuntimeError, match="bind_tokenizer"):
        build_task({**cfg, "heldout_size": 1}).benchmark_records("gcd")


def test_evaluation_rows_keep_the_score_and_report_the_mean_score():
    task = ReasoningGymTask([{"name": "knights_knaves", "weight": 1.0, "config": {}}], heldout_size=2, chat=False)
    records = task.benchmark_records("knights_knaves")
    gold = [r["answer"] for r in records]
    flipped = flip_one(task.heldout_entries("knights_knaves")[0][1])
    samples = [
        [(f"<answer>{gold[0]}</answer>", 5), (f"<answer>{flipped}</answer>", 5)],
        [("no answer", 5), (f"<answer>{gold[1]}</answer>", 5)],
    ]
    rows = checked_rows(records, samples, task.extract, resolve_scorer(task))
    scores = [r["score"] for r in rows]
    assert scores[0] == 1.0 and 0.0 < scores[1] < 1.0 and scores[2:] == [0.0, 1.0]
    assert [r["correct"] for r in rows] == [True, False, False, True]
    metrics = summarize(pd.DataFrame(rows), 2, partial=True)
    assert metrics["avg@2"] == 0.5 and metrics["score@2"] == pytest.approx((1.0 + scores[1] + 0.0 + 1.0) / 4)
    assert metrics["no_answer"] == 0.25 and "score@2" not in summarize(pd.DataFrame(rows), 2)


@pytest.mark.parametrize(
    "override, message",
    [
        ("task.datasets=[{name:knight_knaves,weight:1,config:{}}]", "unknown Reasoning Gym dataset 'knight_knaves'"),
        ("task.datasets=[{name:knights_knaves,config:{n_peple:2}}]", "n_peple: unknown key for knights_knaves"),
        ("task.datasets=[{name:knights_knaves,config:{n_people:0}}]", "knights_knaves rejects {'n_people': 0}"),
        ("task.datasets=[{name:knights_knaves,weight:0,config:{}}]", "[0].weight: must be a number > 0, got 0"),
        ("task.datasets=[{name:gcd,weight:-1.5,config:{}}]", "[0].weight: must be a number > 0, got -1.5"),
        ("task.datasets=[{name:gcd,weight:1,config:{seed:1}}]", "config.seed: set by the task"),
        ("task.datasets=[{name:gcd},{name:gcd}]", "[1].name: 'gcd' is listed twice"),
        ("eval.benchmarks=[rg:zebra_puzzle]", "benchmark 'rg:zebra_puzzle': unknown Reasoning Gym dataset"),
    ],
)
def test_bad_input_is_refused_with_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        compose(["task=reasoning_gym", "model=qwen2_5_1_5b", override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_closest_names_are_offered():
    with pytest.raises(ConfigError, match=r"closest: zebra_puzzles"):
        compose(["task=reasoning_gym", "task.datasets=[{name:zebra_puzzle,weight:1,config:{}}]"])
    assert compose(["eval.benchmarks=[rg:knights_knaves,arithmetic]"]).eval.benchmarks[0] == "rg:knights_knaves"


def test_the_built_in_model_is_refused_for_the_task():
    """Its 64 positions can not hold the prompts: refused before launch, not an index error at step 1."""
    with pytest.raises(ConfigError, match=r"^model.name_or_path: the built-in model reads 64 tokens"):
        compose(["task=reasoning_gym"])
    assert compose(["task=reasoning_gym", "model=qwen2_5_1_5b"]).task.name == "reasoning_gym"


REFUSE = """
    import sys
    if sys.argv[1] == "hide":
        sys.modules["reasoning_gym"] = None  # find_spec: not installed
    from stare_lab.cli import main
    code = main(["train", *sys.argv[2:]])
    heavy = sorted(m for m in ("trl", "transformers") if m in sys.modules)
    print("torch loaded:", "torch" in sys.modules, "heavy:", heavy)
    sys.exit(code)
"""


@pytest.mark.parametrize(
    "mode, argv, message",
    [
        ("keep", ["task=reasoning_gym", "task.datasets=[{name:knight_knaves}]"], "closest: knights_knaves"),
        ("keep", ["task=reasoning_gym", "task.datasets=[{name:maze,config:{min_dist:9,max_dist:2}}]"], "maze rejects"),
        ("hide", ["task=reasoning_gym"], "needs the reasoning-gym package, which is not installed here"),
        ("hide", ["eval.benchmarks=[rg:maze]"], "pip install reasoning-gym==0.1.25"),
    ],
)
def test_refusals_exit_2_in_one_line_without_torch(mode, argv, message):
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(REFUSE), mode, *argv], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 2, run.stderr
    assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "torch loaded: False heavy: []" in run.stdout


@pytest.mark.parametrize(
    "text, number",
    [
        ("7 + 5 = 12", "12"),
        ("The sum is -3.", "-3"),
        ("3 + 4 = 7, so 7 * 2 = 14.5 in total", "14.5"),
        ("That makes 1,234 apples", "1234"),
        ("12 apples and 3,00 pears", "00"),  # not a thousands group: the digits after the comma are a number
        ("no digits here", None),
        ("", None),
    ],
)
def test_last_number_reads_the_completions_last_number(text, number):
    from stare_lab.tasks.reasoning_gym import last_number

    assert last_number(text) == number


def test_answer_last_number_scores_the_last_number_with_the_datasets_own_score():
    """`answer: last_number`: no tags needed; the dataset's score_answer judges the last number written."""
    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    task = ReasoningGymTask(
        [{"name": "basic_arithmetic", "weight": 1.0, "config": config}],
        heldout_size=3,
        chat=False,
        template="{question}\nGive the number.",
        answer="last_number",
    )
    library = reasoning_gym.create_dataset("basic_arithmetic", **config)
    for record in task.benchmark_records("basic_arithmetic"):
        entry = library_entry("basic_arithmetic", config, record["problem_id"])
        gold = int(entry["answer"])
        completions = [
            f"So the answer is {gold}",
            f"{gold} and then {gold + 1}",
            "I do not know",
            f"<answer>{gold}</answer>",
        ]
        logged: dict[str, float] = {}
        rewards = task.reward(
            completions,
            answer=[record["answer"]] * 4,
            problem_id=[record["problem_id"]] * 4,
            log_metric=logged.__setitem__,
        )
        assert rewards[0] == 1.0 and rewards[3] == 1.0 and rewards[2] == 0.0
        assert rewards[1] == library.score_answer(str(gold + 1), entry) < 1.0
        assert logged["task/no_answer"] == 0.25
        assert "Give the number." in record["prompt"] and "<answer>" not in record["prompt"]


def test_answer_format_and_its_template_are_checked():
    with pytest.raises(ValueError, match="task.answer: expected one of tag, last_number, got 'last'"):
        ReasoningGymTask([{"name": "gcd"}], answer="last")
    with pytest.raises(ValueError, match=r"must contain '\{question\}' and '\{tag\}' \(task.answer: tag\)"):
        ReasoningGymTask([{"name": "gcd"}], template="{question} give a number")
    assert (
        ReasoningGymTask([{"name": "gcd"}], template="{question} give a number", answer="last_number").answer
        == "last_number"
    )
    with pytest.raises(ConfigError, match="task.answer"):
        compose(["task=reasoning_gym", "model=qwen2_5_1_5b", "task.answer=number"])


def test_the_packaged_chain_sum_task_is_the_smollm2_sweeps():
    """`task=chain_sum` (the README's quick start on SmolLM2) composes the task the SmolLM2 sweep trains on."""
    from omegaconf import OmegaConf

    from stare_lab.plan.expand import expand_sweep
    from stare_lab.plan.schema import load_sweep

    packaged = OmegaConf.to_container(compose(["model=smollm2", "task=chain_sum"]).task)
    run = next(r for r in expand_sweep(load_sweep("smollm2_chain_sum")) if r.label == "full seed=0")
    assert packaged == run.config["task"]
    assert packaged["answer"] == "last_number" and packaged["datasets"][0]["name"] == "chain_sum"


def test_the_readme_command_on_smollm2_is_the_sweeps_full_run():
    """`stare-lab train model=smollm2 task=chain_sum trainer=cpu_smollm2 eval=chain_sum` (README) trains the
    run the SmolLM2 sweep's `full seed=0` trained: the same resolved config outside the run's own section."""
    from omegaconf import OmegaConf

    from stare_lab.plan.expand import expand_sweep
    from stare_lab.plan.schema import load_sweep

    cfg = compose(["model=smollm2", "task=chain_sum", "trainer=cpu_smollm2", "eval=chain_sum"])
    readme = {k: v for k, v in OmegaConf.to_container(cfg).items() if k != "run"}
    run = next(r for r in expand_sweep(load_sweep("smollm2_chain_sum")) if r.label == "full seed=0")
    assert readme == {k: v for k, v in run.config.items() if k != "run"}
