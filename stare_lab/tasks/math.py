r"""Math word problems with a `\boxed{}` answer, checked by math-verify.

The prompt template is fixed across arms. The reward is 1.0 exactly when the completion's *last*
`\boxed{...}` (or `\fbox{...}`) verifies against the gold answer with
`math_verify.verify(gold, pred)`, gold first.

math-verify 0.9 notes (what was verified with the pinned version):
1. It times out with `signal.alarm`, which only works on the main thread; elsewhere (TRL reward
   workers, evaluation threads) we pass `parsing_timeout=None` / `timeout_seconds=None`.
2. A bare LaTeX gold such as `\left( 3, \frac{\pi}{2} \right)` or `3\sqrt{13}` parses to a
   fragment (`3`) without delimiters; wrapped as `\boxed{...}` all 500 MATH-500 answers parse.
3. An equation prediction `x=5` verifies against gold `5` (math-verify takes the right-hand side).
"""

from __future__ import annotations

import inspect
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from stare_lab.tasks.loaders import load_records

MATH_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{}."

_BOX_RE = re.compile(r"\\(?:boxed|fbox)")
# aime25.jsonl (stare_lab/data/benchmarks/README.md, "Known quirks") writes `\frac` and `\triangle` with
# one backslash in JSON, so they decode to a form feed + "rac" and a tab + "riangle". A form feed never
# occurs in a math problem: each one is restored to `\f`. A tab is restored to `\t` only when a LaTeX
# command name follows, so real tabs (MATH-500 rows 17 and 426: Asymptote code, "have\tequal") stay as they are.
# Short names whose tail is an English word (\tan, \to, \tau, \top) are left out on purpose.
_TAB_COMMANDS = ("triangle", "times", "theta", "text", "textbf", "textit", "tfrac", "tilde", "therefore")
_BROKEN_TAB_RE = re.compile(
    r"\t(" + "|".join(c[1:] for c in sorted(_TAB_COMMANDS, key=len, reverse=True)) + r")(?![A-Za-z])"
)


def repair_latex_escapes(text: str) -> str:
    r"""Undo JSON-decoded single-backslash LaTeX (`\f` → form feed, `\t` → tab) in a problem."""
    text = text.replace("\x0c", "\\f")
    return _BROKEN_TAB_RE.sub(lambda m: "\\t" + m.group(1), text)


def build_prompt(problem: str, template: str = MATH_TEMPLATE) -> str:
    """The plain-text prompt: `{problem}` in `template` replaced (str.replace, so LaTeX braces
    in the template need no escaping), after `repair_latex_escapes`."""
    return template.replace("{problem}", repair_latex_escapes(problem))


def chat_messages(problem: str, template: str = MATH_TEMPLATE, system: str | None = None) -> list[dict[str, str]]:
    """The same prompt as one user turn (plus an optional system turn), for chat models."""
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": build_prompt(problem, template)}]


def extract_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` / `\fbox{...}` (nested braces kept), else None.

    Also reads the brace-less form `\boxed 5`. An unclosed last box (a truncated completion) and
    an empty box give None.
    """
    if not isinstance(text, str):
        return None
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return None
    i = matches[-1].end()
    if i < len(text) and text[i] == " ":
        m = re.match(r" +([^\s$]+)", text[i:])
        return m.group(1) if m else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                content = text[i + 1 : j].strip()
                return content or None
    return None


def completion_text(completion: Any) -> str:
    """Plain text of a completion: a string, or TRL's conversational form (a list of messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    return "" if completion is None else str(completion)


def _timeouts_usable() -> bool:
    return threading.current_thread() is threading.main_thread()


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeouts: bool) -> list:
    from math_verify import parse  # deferred: math_verify (sympy), only when an answer is checked

    timeout = 5 if timeouts else None
    gold = gold.strip()
    if "\\boxed" in gold:
        return parse(gold, parsing_timeout=timeout)
    # `\$36` (MATH-500's money answers) contains "$" but is not math-mode delimited: wrap it too.
    return (
        parse("\\boxed{" + gold + "}", parsing_timeout=timeout)
        or parse("$" + gold + "$", parsing_timeout=timeout)
        or parse(gold, parsing_timeout=timeout)
    )


def verify_boxed(pred: str | None, gold: str) -> bool:
    r"""True when the extracted answer `pred` verifies against `gold` (any error: False)."""
    if pred is None:
        return False
    try:
        from math_verify import parse, verify  # deferred: as in _parse_gold

        timeouts = _timeouts_usable()
        gold_parsed = _parse_gold(str(gold), timeouts)
        pred_parsed = parse("\\boxed{" + pred + "}", parsing_timeout=5 if timeouts else None)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=5 if timeouts else None))
    except Exception:  # a reward must never crash training: malformed LaTeX, sympy errors, timeouts
        logging.getLogger(__name__).debug("math_verify failed on %r vs %r", pred, gold, exc_info=True)
        return False


def math_reward(completions: Sequence[Any], answers: Sequence[str]) -> list[float]:
    r"""1.0 where the completion's last `\boxed{}` answer verifies against the gold answer, else 0.0."""
    if len(completions) != len(answers):
        raise ValueError(f"math_reward: {len(completions)} completions but {len(answers)} answers")
    return [
        float(verify_boxed(extract_boxed(completion_text(c)), a)) for c, a in zip(completions, answers, strict=True)
    ]


def constructor_kwargs(cls: type, cfg: Mapping[str, Any], task: str) -> dict[str, Any]:
    """The `task` block (without its `name`) as `cls`'s constructor arguments; a key the constructor does
    not take is a ValueError naming it and the valid keys."""
    kwargs = {k: v for k, v in dict(cfg).items() if k != "name"}
    known = set(inspect.signature(cls.__init__).parameters) - {"self"}  # type: ignore[misc]
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ValueError(f"task.{unknown[0]}: unknown key for task '{task}'; valid keys: {sorted(known)}")
    return kwargs


class MathTask:
    r"""A `\boxed{}` math task: train and held-out records, prompt template, math-verify reward.

    Same interface as `ArithmeticTask`. Datasets have columns `prompt` (text, or a message list
    when `chat=True`), `answer` and `problem_id`; TRL passes `answer` to `reward` as a keyword.
    """

    name = "math"

    def __init__(
        self,
        train_source: str | None = None,
        heldout_source: str | None = None,
        *,
        train_split: str = "train",
        heldout_split: str = "test",
        train_subset: str | None = None,
        heldout_subset: str | None = None,
        fields: Mapping[str, Any] | None = None,
        heldout_fields: Mapping[str, Any] | None = None,
        train_limit: int | None = None,
        heldout_limit: int | None = None,
        template: str = MATH_TEMPLATE,
        chat: bool = False,
        system_prompt: str | None = None,
    ) -> None:
        if "{problem}" not in template:
            raise ValueError(f"math task template must contain '{{problem}}', got {template!r}")
        self.train = dict(source=train_source, split=train_split, subset=train_subset, fields=fields, limit=train_limit)
        self.heldout = dict(
            source=heldout_source,
            split=heldout_split,
            subset=heldout_subset,
            fields=heldout_fields if heldout_fields is not None else fields,
            limit=heldout_limit,
        )
        self.template, self.chat, self.system_prompt = template, chat, system_prompt

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> MathTask:
        return cls(**constructor_kwargs(cls, cfg, "math"))

    def prompt(self, problem: str) -> str | list[dict[str, str]]:
        if self.chat:
            return chat_messages(problem, self.template, self.system_prompt)
        return build_prompt(problem, self.template)

    def _dataset(self, spec: dict, which: str):
        import datasets  # deferred: datasets, only when the task's data is read

        if not spec["source"]:
            raise ValueError(f"task.{which}_source is not set for task 'math'")
        records = load_records(
            spec["source"], split=spec["split"], fields=spec["fields"], subset=spec["subset"], limit=spec["limit"]
        )
        return datasets.Dataset.from_list(
            [
                {"prompt": self.prompt(r["problem"]), "answer": r["answer"], "problem_id": r["problem_id"]}
                for r in records
            ]
        )

    def train_dataset(self):
        return self._dataset(self.train, "train")

    def heldout_dataset(self):
        return self._dataset(self.heldout, "heldout")

    def extract(self, completion: Any) -> str | None:
        return extract_boxed(completion_text(completion))

    def verify(self, completion: Any, answer: str) -> bool:
        return verify_boxed(self.extract(completion), answer)

    def reward(self, completions: Sequence[Any], answer: Sequence[str], **kwargs: Any) -> list[float]:
        return math_reward(completions, answer)
