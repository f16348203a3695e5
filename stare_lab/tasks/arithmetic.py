"""Synthetic arithmetic: the built-in verifiable task.

A problem is ``a+b*c`` with two-digit ``a`` and one-digit ``b`` and ``c``. The prompt is plain
text (no chat template) and the reference completion works the product first, then the sum, and
ends the answer with ``#``::

    prompt      "37+4*6="
    completion  "4*6=24;37+24=61#"      (then EOS; at most 17 characters)
    answer      "61"

The built-in model is trained on a mixture of this procedure and a wrong one, left to right
(:func:`left_to_right`: ``"37+4=41;41*6=246#"``), so that its first completion tokens, which
choose the procedure, decide correctness and carry real uncertainty (``train_builtin``).

Splits. Each of the 5,760 problems is assigned to a split by a hash of its text (about 10% are
held out), so train and held-out are disjoint for every seed and size. The held-out split is
fixed: it does not depend on ``seed``. The train split is drawn without repetition from a
``random.Random(seed)`` stream.
"""

from __future__ import annotations

import hashlib
import random
import re

import datasets

_HELDOUT_BUCKETS = 10  # hash % 10 == 0 → held out
_HELDOUT_SEED = 20261129  # fixes the held-out problems once for all runs
_NUMBER = re.compile(r"-?\d+")


def _problem_text(a: int, b: int, c: int) -> str:
    return f"{a}+{b}*{c}"


def _is_heldout(problem: str) -> bool:
    digest = hashlib.sha256(problem.encode()).digest()
    return int.from_bytes(digest[:8], "big") % _HELDOUT_BUCKETS == 0


def solution(a: int, b: int, c: int) -> str:
    """The reference completion (without EOS) for ``a+b*c=``."""
    p = b * c
    return f"{b}*{c}={p};{a}+{p}={a + p}#"


def left_to_right(a: int, b: int, c: int) -> str:
    """The wrong procedure the built-in model also learns: ``(a+b)*c``, ignoring precedence.

    Its answer never equals ``a+b*c`` on this task's ranges: ``(a+b)*c - (a+b*c) = a*(c-1) > 0``.
    """
    s = a + b
    return f"{a}+{b}={s};{s}*{c}={s * c}#"


class ArithmeticTask:
    """``a+b*c`` with a worked two-step completion and an exact verifier."""

    name = "arithmetic"

    def __init__(
        self,
        train_size: int = 2000,
        heldout_size: int = 200,
        seed: int = 0,
        a_range: tuple[int, int] = (10, 99),
        b_range: tuple[int, int] = (2, 9),
        c_range: tuple[int, int] = (2, 9),
    ):
        self.train_size = train_size
        self.heldout_size = heldout_size
        self.seed = seed
        self.ranges = (a_range, b_range, c_range)
        n_problems = 1
        for lo, hi in self.ranges:
            n_problems *= hi - lo + 1
        # ~10% of problems are held out; refuse sizes the split cannot supply without repeats.
        if heldout_size > n_problems // (2 * _HELDOUT_BUCKETS) or train_size > n_problems * 8 // 10:
            raise ValueError(
                f"train_size={train_size}/heldout_size={heldout_size} too large for {n_problems} distinct problems"
            )

    def _draw(self, rng: random.Random, n: int, heldout: bool) -> datasets.Dataset:
        seen: set[str] = set()
        rows: dict[str, list[str]] = {"prompt": [], "answer": [], "problem_id": [], "solution": []}
        while len(seen) < n:
            a, b, c = (rng.randint(lo, hi) for lo, hi in self.ranges)
            problem = _problem_text(a, b, c)
            if problem in seen or _is_heldout(problem) != heldout:
                continue
            seen.add(problem)
            rows["prompt"].append(problem + "=")
            rows["answer"].append(str(a + b * c))
            rows["problem_id"].append(problem)
            rows["solution"].append(solution(a, b, c))
        return datasets.Dataset.from_dict(rows)

    def train_dataset(self) -> datasets.Dataset:
        """Columns ``prompt``, ``answer``, ``problem_id``, ``solution`` (the reference completion)."""
        return self._draw(random.Random(self.seed), self.train_size, heldout=False)

    def heldout_dataset(self) -> datasets.Dataset:
        """The fixed held-out problems; same columns as :meth:`train_dataset`."""
        return self._draw(random.Random(_HELDOUT_SEED), self.heldout_size, heldout=True)

    @staticmethod
    def extract(completion: str) -> str | None:
        """The final answer: the number after the last ``=`` before the first ``#``; None if absent."""
        head, sep, _ = completion.partition("#")
        if not sep or "=" not in head:
            return None
        tail = head.rsplit("=", 1)[1]
        return tail if _NUMBER.fullmatch(tail) else None

    @classmethod
    def verify(cls, completion: str, answer: str) -> bool:
        got = cls.extract(completion)
        return got is not None and int(got) == int(answer)

    def reward(self, completions: list[str], answer: list[str], **kwargs) -> list[float]:
        """TRL reward function: 1.0 where the completion's final answer equals ``answer``, else 0.0.

        TRL passes ``prompts``, ``completion_ids``, ``trainer_state`` and every dataset column as
        keyword arguments; they are ignored. TRL names the function by ``__name__`` ("reward").
        """
        return [1.0 if self.verify(c, a) else 0.0 for c, a in zip(completions, answer, strict=True)]
