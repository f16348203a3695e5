"""Reasoning Gym's procedural tasks (`reasoning-gym`, arXiv 2505.24760): logic puzzles, algorithmic
tasks, graphs, games and more, each generated offline with its own verifier (docs/tasks.md).

`task.datasets` is a list of `{name, weight, config}` (config: the generator's own keys, difficulty
included) mixed by weight by the library's composite dataset. Each dataset is also a benchmark,
`rg:<name>`, evaluated on its held-out problems.

Splits. The held-out problems of a dataset come from a seed of their own (`heldout_seed` plus a hash of
the dataset's name, so they depend only on the dataset, its config, `heldout_seed` and `heldout_size`,
never on the training seed or the other datasets): the first `heldout_size` distinct questions of that
stream. Training problems are the composite's stream from `seed`; a training problem whose question is a
held-out question is removed (and counted: `split_record`, written to the run's task.json) and the
stream goes on until `train_size` remain. Most generators draw item i from `Random(seed + i)`, so
streams with close seeds overlap: the removal, not the seeds, is what keeps the splits disjoint.

Prompt: the question in `template` (`{question}`; `{tag}` is `answer_tag`), through the model's chat
template when it has one (`chat: auto`). Reward: the dataset's own `score_answer` on the answer read from
the completion (partial credit kept as the dataset gives it); a completion without one scores 0 and is
counted (`task/no_answer`). `answer: tag` (the library's convention) reads the text of the last
`<answer>…</answer>`; `answer: last_number` reads the completion's last number (`-3`, `12.5`, `1,234` as
`1234`), for numeric datasets and models too small to write the tags (SmolLM2-135M writes them in 0-2% of
completions, analysis/smollm2_pilot/results.md). Our decision, not the library's: with `last_number` a
completion that states a right sum and then another number is wrong, as a reader taking the last
number would score it; the template then needs no `{tag}`.

reasoning-gym 0.1.25 notes: importing it takes ~1.6 s (cellpylib imports matplotlib.pyplot, the
algebra tasks sympy) and no torch; `score_answer` of some datasets (countdown, puzzle24) gives 0.01 for
no answer, which the rule above replaces by 0; some datasets (propositional_logic, graph_color) have no
single oracle answer (`answer` None, recorded as ""), and are scored by `score_answer` all the same.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from stare_lab.tasks.math import completion_text, constructor_kwargs
from stare_lab.tasks.reasoning_gym_specs import (
    BENCHMARK_PREFIX,
    MISSING_PACKAGE,
    PACKAGE_PIN,
    Spec,
    benchmark_problem,
    create,
    datasets_problem,
    heldout_budget,
    heldout_seed_of,
    parse_specs,
    registry,
)

__all__ = [
    "BENCHMARK_PREFIX",
    "MISSING_PACKAGE",
    "PACKAGE_PIN",
    "ReasoningGymTask",
    "Spec",
    "benchmark_problem",
    "benchmark_task",
    "chat_template_present",
    "create",
    "datasets_problem",
    "heldout_budget",
    "heldout_seed_of",
    "parse_specs",
    "registry",
]

TEMPLATE = (
    "{question}\n\nThink step by step, then give only your final answer between <{tag}> and </{tag}>. "
    "When an example is provided, follow the format of the answer in that example."
)
HELDOUT_SEED = 20261129  # conf/task/reasoning_gym.yaml's held-out seed, for a task built without it
ANSWER_FORMATS = ("tag", "last_number")
# a number as written in a completion: sign, digits with optional thousands commas, optional decimals
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number of `text` as the datasets write answers (`1,234` → `1234`, `12.50` kept as
    written), or None where it has none."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def chat_template_present(model: Any, tokenizer: Any) -> bool:
    """The model's tokenizer has a chat template (a vLLM engine: its own tokenizer's)."""
    if tokenizer is None and hasattr(model, "get_tokenizer"):
        tokenizer = model.get_tokenizer()
    return bool(getattr(tokenizer, "chat_template", None))


class ReasoningGymTask:
    """A weighted mix of Reasoning Gym datasets: prompts, splits and the datasets' own scores.

    Datasets have columns `prompt`, `answer`, `problem_id` (`<dataset>/<split>/<index>`) and
    `source_dataset`; TRL passes `answer` and `problem_id` to `reward`, which looks the problem up.
    """

    name = "reasoning_gym"
    verifier = "reasoning_gym"
    partial_credit = True

    def __init__(
        self,
        datasets: Sequence[Mapping[str, Any]],
        train_size: int = 2000,
        heldout_size: int = 200,
        seed: int = 0,
        heldout_seed: int = HELDOUT_SEED,
        template: str = TEMPLATE,
        answer_tag: str = "answer",
        chat: bool | str = "auto",
        system_prompt: str | None = None,
        answer: str = "tag",
    ) -> None:
        if answer not in ANSWER_FORMATS:
            raise ValueError(f"task.answer: expected one of {', '.join(ANSWER_FORMATS)}, got {answer!r}")
        if "{question}" not in template or (answer == "tag" and "{tag}" not in template):
            needs = "'{question}' and '{tag}'" if answer == "tag" else "'{question}'"
            raise ValueError(f"task.template: must contain {needs} (task.answer: {answer}), got {template!r}")
        if not str(answer_tag).isidentifier():
            raise ValueError(f"task.answer_tag: expected a tag name such as 'answer', got {answer_tag!r}")
        if chat not in (True, False, "auto"):
            raise ValueError(f"task.chat: expected true, false or auto, got {chat!r}")
        self.specs = parse_specs(list(datasets))
        self.train_size, self.heldout_size = int(train_size), int(heldout_size)
        self.seed, self.heldout_seed = int(seed), int(heldout_seed)
        self.template, self.answer_tag, self.system_prompt = template, str(answer_tag), system_prompt
        self.chat: bool | str = chat
        self.answer = answer
        self._entries: dict[str, dict[str, Any]] = {}  # problem_id → the generator's entry, for scoring
        self._heldout: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        self._report: dict[str, Any] = {"heldout": {}, "train": {}}
        self._scorers: dict[str, Any] = {}

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ReasoningGymTask:
        return cls(**constructor_kwargs(cls, cfg, "reasoning_gym"))

    @property
    def dataset_names(self) -> list[str]:
        return [s.name for s in self.specs]

    @staticmethod
    def category_of(name: str) -> str:
        """The library's category of a dataset (its package: logic, games, graphs, ...)."""
        return registry()[name][0].__module__.split(".")[1]

    def bind_chat(self, chat_template: bool) -> None:
        """Resolve `chat: auto` with whether the model's tokenizer has a chat template."""
        if self.chat == "auto":
            self.chat = bool(chat_template)

    def bind_tokenizer(self, tokenizer: Any) -> None:
        self.bind_chat(chat_template_present(None, tokenizer))

    # ------------------------------------------------------------------------------ prompts
    def prompt(self, question: str) -> str | list[dict[str, str]]:
        if self.chat == "auto":
            raise RuntimeError("task.chat is auto: bind_tokenizer(tokenizer) decides it before prompts are built")
        text = self.template.replace("{tag}", self.answer_tag).replace("{question}", question)
        if not self.chat:
            return text if self.system_prompt is None else f"{self.system_prompt}\n\n{text}"
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": text}]

    def _row(self, problem_id: str, name: str, entry: dict[str, Any]) -> dict[str, Any]:
        self._entries[problem_id] = {**entry, "_dataset": name}
        answer = entry.get("answer")
        return {
            "prompt": self.prompt(entry["question"]),
            "answer": "" if answer is None else str(answer),
            "problem_id": problem_id,
            "source_dataset": name,
        }

    # ------------------------------------------------------------------------------ splits
    def heldout_entries(self, name: str) -> list[tuple[str, dict[str, Any]]]:
        """(problem_id, entry) of a dataset's held-out problems: the first `heldout_size` distinct
        questions of its own stream (duplicates skipped and counted)."""
        if name not in self._heldout:
            spec = next(s for s in self.specs if s.name == name)
            seed = heldout_seed_of(name, self.heldout_seed)
            budget = heldout_budget(self.heldout_size)
            generator = create(name, spec.kwargs, seed=seed, size=budget)
            kept: dict[str, tuple[str, dict[str, Any]]] = {}
            draws = 0
            for i in range(budget):
                if len(kept) == self.heldout_size:
                    break
                entry, draws = generator[i], i + 1
                kept.setdefault(entry["question"], (f"{name}/heldout/{i}", entry))
            if len(kept) < self.heldout_size:
                raise ValueError(
                    f"task.datasets: {name} gave {len(kept)} distinct held-out problems in {budget} draws "
                    f"(task.heldout_size = {self.heldout_size}): its config has too few problems"
                )
            self._heldout[name] = list(kept.values())
            self._report["heldout"][name] = {
                "problems": self.heldout_size,
                "seed": seed,
                "draws": draws,
                "duplicates_skipped": draws - self.heldout_size,
            }
        return self._heldout[name]

    def heldout_questions(self) -> set[str]:
        return {e["question"] for name in self.dataset_names for _, e in self.heldout_entries(name)}

    def benchmark_records(self, name: str) -> list[dict[str, Any]]:
        """The records of benchmark `rg:<name>` (evaluation's format: prompt, problem, answer, problem_id)."""
        rows = [self._row(pid, name, entry) for pid, entry in self.heldout_entries(name)]
        return [{**r, "problem": r["prompt"]} for r in rows]

    def train_rows(self) -> list[dict[str, Any]]:
        """`train_size` problems of the composite's stream from `seed`, held-out questions removed."""
        from reasoning_gym.composite import DatasetSpec  # deferred: as in registry

        held = self.heldout_questions()
        budget = 4 * self.train_size + 2 * len(held) + 64
        composite = create(
            "composite",
            {"datasets": [DatasetSpec(s.name, s.weight, s.kwargs) for s in self.specs]},
            seed=self.seed,
            size=budget,
        )
        rows: list[dict[str, Any]] = []
        removed, drawn = Counter[str](), Counter[str]()
        for i in range(budget):
            if len(rows) == self.train_size:
                break
            entry = composite[i]
            name = entry["metadata"]["source_dataset"]
            drawn[name] += 1
            if entry["question"] in held:
                removed[name] += 1
                continue
            rows.append(self._row(f"{name}/train/{i}", name, entry))
        if len(rows) < self.train_size:
            raise ValueError(
                f"task.datasets: {len(rows)} training problems outside the held-out set in {budget} draws "
                f"(task.train_size = {self.train_size}): the configs have too few problems"
            )
        self._report["train"] = {
            "problems": len(rows),
            "seed": self.seed,
            "per_dataset": {s.name: drawn[s.name] - removed[s.name] for s in self.specs},
            "heldout_collisions_removed": {s.name: removed[s.name] for s in self.specs},
        }
        return rows

    def train_dataset(self):
        import datasets  # deferred: datasets, only when the task's data is built

        return datasets.Dataset.from_list(self.train_rows())

    def heldout_dataset(self):
        """Every dataset's held-out problems, in the order of `task.datasets` (the `reasoning_gym` benchmark)."""
        import datasets  # deferred: as in train_dataset

        rows = [self._row(pid, n, e) for n in self.dataset_names for pid, e in self.heldout_entries(n)]
        return datasets.Dataset.from_list(rows)

    def split_record(self) -> dict[str, Any]:
        """What the run records of its splits (task.json): sizes, seeds, draws, collisions removed."""
        categories = {s.name: self.category_of(s.name) for s in self.specs}
        return {"task": self.name, "datasets": [s.name for s in self.specs], "categories": categories, **self._report}

    # ------------------------------------------------------------------------------ scores
    def extract(self, completion: Any) -> str | None:
        """The completion's answer: its last `<answer_tag>` text (`answer: tag`) or last number."""
        if self.answer == "last_number":
            return last_number(completion_text(completion))
        from reasoning_gym.utils import extract_answer  # deferred: as in registry

        return extract_answer(completion_text(completion), tag_name=self.answer_tag)

    def score_one(self, completion: Any, problem_id: str) -> tuple[float, bool]:
        """(the dataset's score of the completion's answer, whether an answer was extracted)."""
        entry = self._entries.get(str(problem_id))
        if entry is None:
            raise KeyError(f"reasoning_gym: problem {problem_id!r} was not generated by this task")
        extracted = self.extract(completion)
        if extracted is None:
            return 0.0, False
        clean = {k: v for k, v in entry.items() if k != "_dataset"}
        try:
            return float(self._scorer(entry["_dataset"]).score_answer(extracted, clean)), True
        except Exception:  # a reward must never crash training: a dataset's scorer failing on an odd answer
            logging.getLogger(__name__).debug("score_answer failed on %r (%s)", extracted, problem_id, exc_info=True)
            return 0.0, True

    def score(self, completion: Any, extracted: Any, record: Mapping[str, Any]) -> float:
        """Evaluation's per-sample score (stare_lab.evaluation.checked_rows)."""
        return self.score_one(completion, record["problem_id"])[0]

    def verify(self, completion: Any, answer: str, problem_id: str | None = None) -> bool:
        """Full credit (score 1.0) on the problem `problem_id` (its `answer` is the entry's own)."""
        if problem_id is None:
            raise TypeError("reasoning_gym: verify needs the problem_id (the datasets score against their entry)")
        return self.score_one(completion, problem_id)[0] == 1.0

    def _scorer(self, name: str) -> Any:
        """The dataset whose `score_answer` scores `name`'s problems (its config: some scores read it)."""
        if name not in self._scorers:
            spec = next(s for s in self.specs if s.name == name)
            self._scorers[name] = create(name, spec.kwargs, seed=0, size=1)
        return self._scorers[name]

    def reward(
        self, completions: Sequence[Any], answer: Sequence[str], problem_id: Sequence[str], **kwargs: Any
    ) -> list[float]:
        """TRL reward function: each completion's score; logs `task/no_answer` (completions without an
        answer), `task/partial` (0 < score < 1) and `task/<dataset>/score` through TRL's `log_metric`."""
        scored = [self.score_one(c, p) for c, p in zip(completions, problem_id, strict=True)]
        log = kwargs.get("log_metric")
        if log is not None and scored:
            log("task/no_answer", sum(not ok for _, ok in scored) / len(scored))
            log("task/partial", sum(0.0 < s < 1.0 for s, _ in scored) / len(scored))
            by: dict[str, list[float]] = {}
            for (s, _), p in zip(scored, problem_id, strict=True):
                by.setdefault(self._entries[str(p)]["_dataset"], []).append(s)
            for name, values in by.items():
                log(f"task/{name}/score", sum(values) / len(values))
        return [s for s, _ in scored]


def benchmark_task(benchmark: str, run_task: Any, own: Mapping[str, Any]) -> ReasoningGymTask:
    """The task that supplies benchmark `rg:<dataset>`: the run's own when it trains on that dataset
    (its config, held-out seed and size), else that dataset alone at its default config with the
    benchmark file's `heldout_size` and `heldout_seed` (conf/benchmark/reasoning_gym.yaml)."""
    name = benchmark[len(BENCHMARK_PREFIX) :]
    if isinstance(run_task, ReasoningGymTask) and name in run_task.dataset_names:
        return run_task
    return ReasoningGymTask(
        [{"name": name, "weight": 1.0, "config": {}}],
        train_size=1,
        heldout_size=int(own["heldout_size"]),
        heldout_seed=int(own["heldout_seed"]),
        chat=getattr(run_task, "chat", "auto") if isinstance(run_task, ReasoningGymTask) else "auto",
    )
