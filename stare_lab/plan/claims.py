"""Claims as data: a sweep's `claims:` block (or a claims file's), checked before anything launches.

A claim names two arms A and B (and for a gain form the arm gains are measured from, `base`), a
quantity and a form (docs/claims.md):

    superiority      A > B (+ margin)          inferiority   A < B (− margin)
    non_inferiority  A ≥ B − margin            equivalence   |A − B| ≤ margin
    retained_gain    A − base ≥ f·(B − base)   gain_below    A − base < f·(B − base)

Quantities: a held-out score (`score: avg@32` or `pass@4`, on `benchmarks:`, their equally weighted
mean when several), a training metric of metrics.jsonl (`metric: entropy` `at: last`, or averaged over
`steps: [first, last]` or the `last_steps: N`), or the spread over seeds of the final score
(`spread: avg@32`). A margin carries its unit: points for scores and spreads, nats for an entropy,
`cosine` for the gradient cosine, `units` for any other metric. A claim of a sweep with a sequential
design (stare_lab.plan.design) may carry a `target:` in the same unit.

`parse_claims` checks the block alone (the schema calls it); `check_claims` checks it against the
sweep's planned runs (arms by the label analysis gives them, stare_lab.record.arms, plus the
declared controls; the benchmarks and n the runs evaluate; the metrics they log). Every mistake is one
`SweepError` line naming the claim's key. Pure Python: a refusal imports no pandas and no torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeGuard

from stare_lab.launchers.errors import SweepError
from stare_lab.record.arms import CONTROL_ARMS, arm_names

# form → (its statement, whether it needs a margin, whether it needs base and a fraction)
FORMS = {
    "superiority": ("A > B", False, False),
    "inferiority": ("A < B", False, False),
    "non_inferiority": ("A ≥ B − margin", True, False),
    "equivalence": ("|A − B| ≤ margin", True, False),
    "retained_gain": ("A − base ≥ f·(B − base)", False, True),
    "gain_below": ("A − base < f·(B − base)", False, True),
}
CLAIM_KEYS = ("id", "statement", "source", "form", "a", "b", "base", "quantity", "margin", "fraction", "target")
SOURCE_KEYS = ("arxiv", "where", "number", "model", "grade", "note")
SOURCE_REQUIRED = ("arxiv", "where", "number", "model")
UNITS = {"points": ("point", "points", "pts", "pp"), "nats": ("nat", "nats"), "cosine": ("cosine",)}
# Logged by every training run (TRL's and stare_lab's rows of metrics.jsonl, docs/run_record.md); the
# gradient geometry only with trainer.grad_geometry_every > 0; a rule's own `rule/*` only by that rule
ALWAYS_LOGGED = (
    "loss", "grad_norm", "learning_rate", "reward", "reward_std", "accuracy", "entropy", "frac_reward_zero_std",
    "num_tokens", "completions/mean_length", "completions/clipped_ratio", "clip_ratio/region_mean",
    "clip_ratio/low_mean", "clip_ratio/high_mean", "tokens/selected_frac", "tokens/trained_frac",
    "tokens/touched_frac", "tokens/weight_mean", "tokens/weight_std", "tokens/entropy_selected",
    "tokens/rollout_entropy",
)  # fmt: skip
GEOMETRY = ("geometry/cosine", "geometry/norm_ratio")
Fail = Callable[[str, str], NoReturn]  # the caller's one-line refusal: fail(key, message)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SCORE = re.compile(r"^(avg|pass)@(\d+)$")
_MARGIN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*([A-Za-z]+)\s*$")


@dataclass(frozen=True)
class Quantity:
    kind: str  # "score" | "metric" | "spread"
    score: str = ""  # "avg" | "pass" (score, spread)
    k: int = 0  # n of avg@n, k of pass@k
    benchmarks: tuple[str, ...] = ()  # () = every benchmark the arms' runs evaluate
    metric: str = ""
    steps: tuple[int, int] | None = None  # window of steps, both ends included
    last_steps: int = 0  # mean over the last N steps; 0 with steps None: the last logged value

    @property
    def unit(self) -> str:
        if self.kind != "metric":
            return "points"
        if "entropy" in self.metric:
            return "nats"
        return "cosine" if self.metric == "geometry/cosine" else "units"

    @property
    def name(self) -> str:
        """ "avg@32 on arithmetic", "entropy, last step", "seed SD of avg@32 on arithmetic"."""
        if self.kind == "metric":
            when = (
                f"mean over steps {self.steps[0]}-{self.steps[1]}"
                if self.steps
                else (f"mean over the last {self.last_steps} steps" if self.last_steps else "last step")
            )
            return f"{self.metric}, {when}"
        on = f" on {', '.join(self.benchmarks)}" if self.benchmarks else ""
        score = f"{self.score}@{self.k}{on}"
        return f"seed spread of {score}" if self.kind == "spread" else score


@dataclass(frozen=True)
class Claim:
    id: str
    form: str
    a: str
    b: str
    quantity: Quantity
    source: dict[str, str] = field(default_factory=dict)  # {} for a researcher's own claim (`source: own`)
    base: str = ""
    margin: float = 0.0  # in the quantity's unit
    fraction: float = 0.0  # f of the gain forms
    statement: str = ""
    # a sequential design's effect beyond the bound, towards the claim (the quantity's unit; a gain form's in
    # points of (A − base) − f·(B − base)), which its futility stop reads (stare_lab.plan.design)
    target: float | None = None

    @property
    def arms(self) -> tuple[str, ...]:
        return (self.a, self.b, self.base) if self.base else (self.a, self.b)

    @property
    def formula(self) -> str:
        """The claim in its arms' names: "stare > full", "top_entropy ≥ full − 2 points"."""
        a, b, m, u = self.a, self.b, f"{self.margin:g}", self.quantity.unit
        return {
            "superiority": f"{a} > {b}" + (f" + {m} {u}" if self.margin else ""),
            "inferiority": f"{a} < {b}" + (f" − {m} {u}" if self.margin else ""),
            "non_inferiority": f"{a} ≥ {b} − {m} {u}",
            "equivalence": f"|{a} − {b}| ≤ {m} {u}",
            "retained_gain": f"{a} − {self.base} ≥ {self.fraction:g}·({b} − {self.base})",
            "gain_below": f"{a} − {self.base} < {self.fraction:g}·({b} − {self.base})",
        }[self.form]


def parse_claims(block: Any, fail: Fail) -> list[Claim]:
    """The `claims:` list checked alone; `fail(key, message)` raises the caller's one-line error."""
    if block is None:
        return []
    if not isinstance(block, list) or not block:
        fail("claims", "expected a non-empty list of claims (each a mapping with id, source, form, a, b, quantity)")
    claims: list[Claim] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(block):
        claim = _claim(item, f"claims[{i}]", fail)
        if claim.id in seen:
            fail(f"claims[{i}].id", f"duplicate claim id {claim.id!r} (also claims[{seen[claim.id]}])")
        seen[claim.id] = i
        claims.append(claim)
    return claims


def _claim(item: Any, at: str, fail: Fail) -> Claim:
    if not isinstance(item, dict):
        fail(at, f"expected a mapping with keys {', '.join(CLAIM_KEYS)}, got {item!r}")
    for k in item:
        if k not in CLAIM_KEYS:
            fail(at, f"unknown key {k!r}; valid keys: {', '.join(CLAIM_KEYS)}")
    for k in ("id", "source", "form", "a", "b", "quantity"):
        if k not in item:
            fail(at, f"missing required key {k!r}")
    cid = item["id"]
    if not isinstance(cid, str) or not _ID.match(cid):
        fail(f"{at}.id", f"{cid!r} is not a valid claim id (letters, digits, '_', '-', '.')")
    form = item["form"]
    if form not in FORMS:
        fail(f"{at}.form", f"unknown form {form!r}; valid: {', '.join(FORMS)}")
    _, needs_margin, needs_base = FORMS[form]
    for k in ("a", "b") + (("base",) if "base" in item else ()):
        if not isinstance(item[k], str) or not item[k]:
            fail(f"{at}.{k}", f"expected an arm label (e.g. full, top_entropy, base), got {item[k]!r}")
    if needs_base and "base" not in item:
        fail(at, f"form {form} ({FORMS[form][0]}) needs base: the arm the gains are measured from (e.g. base)")
    if not needs_base and ("base" in item or "fraction" in item):
        fail(at, f"form {form} takes no {'base' if 'base' in item else 'fraction'} (only retained_gain, gain_below)")
    arms = [item["a"], item["b"]] + ([item["base"]] if needs_base else [])
    if len(set(arms)) < len(arms):
        fail(at, f"the arms of a claim must differ, got {', '.join(arms)}")
    quantity = _quantity(item["quantity"], f"{at}.quantity", fail)
    if quantity.kind == "spread" and form not in ("superiority", "inferiority"):
        fail(f"{at}.form", "a seed spread is compared by superiority or inferiority (a test on variances)")
    margin = 0.0
    if "margin" in item:
        if form not in ("superiority", "inferiority", "non_inferiority", "equivalence"):
            fail(f"{at}.margin", f"form {form} takes no margin (its fraction is the bound)")
        margin = _margin(item["margin"], quantity, f"{at}.margin", fail)
    elif needs_margin:
        fail(at, f"form {form} ({FORMS[form][0]}) needs a margin with its unit, e.g. margin: 2 {quantity.unit}")
    fraction = _fraction(item.get("fraction"), f"{at}.fraction", fail) if needs_base else 0.0
    target = None
    if "target" in item:
        target = _margin(item["target"], quantity, f"{at}.target", fail, what="target")
        if not target > 0:
            fail(f"{at}.target", f"{item['target']!r}: a target is an effect > 0 beyond the claim's bound")
    statement = item.get("statement", "")
    if not isinstance(statement, str):
        fail(f"{at}.statement", f"expected text, got {statement!r}")
    return Claim(
        id=cid,
        form=form,
        a=item["a"],
        b=item["b"],
        base=item.get("base", ""),
        quantity=quantity,
        source=_source(item["source"], f"{at}.source", fail),
        margin=margin,
        fraction=fraction,
        statement=statement,
        target=target,
    )


def _source(value: Any, at: str, fail: Fail) -> dict[str, str]:
    if value == "own":
        return {}
    if not isinstance(value, dict):
        fail(at, "expected a mapping {arxiv, where, number, model} (the paper's claim), or `own`")
    for k in value:
        if k not in SOURCE_KEYS:
            fail(at, f"unknown key {k!r}; valid keys: {', '.join(SOURCE_KEYS)}")
    for k in SOURCE_REQUIRED:
        if not isinstance(value.get(k), (str, int, float)) or str(value.get(k)).strip() == "":
            fail(at, f"missing {k!r}: a source names its arXiv id, table or figure, the paper's number and model")
    return {k: str(v) for k, v in value.items()}


def _quantity(value: Any, at: str, fail: Fail) -> Quantity:
    if not isinstance(value, dict):
        fail(at, "expected a mapping: {score: avg@32, benchmarks: [..]}, {metric: entropy, at: last} or {spread: ..}")
    kinds = [k for k in ("score", "metric", "spread") if k in value]
    if len(kinds) != 1:
        fail(at, "name exactly one of score (avg@N, pass@K), metric (a metrics.jsonl name) or spread (avg@N)")
    kind = kinds[0]
    allowed = {"score": ("score", "benchmarks"), "spread": ("spread", "benchmarks")}.get(
        kind, ("metric", "at", "steps", "last_steps")
    )
    for k in value:
        if k not in allowed:
            fail(at, f"unknown key {k!r} for a {kind}; valid keys: {', '.join(allowed)}")
    if kind == "metric":
        return _metric_quantity(value, at, fail)
    m = _SCORE.match(str(value[kind]))
    if not m or int(m.group(2)) < 1:
        fail(f"{at}.{kind}", f"{value[kind]!r}: expected avg@N or pass@K (e.g. avg@32, pass@4)")
    if kind == "spread" and m.group(1) != "avg":
        fail(f"{at}.spread", "the seed spread is of the final avg@N score")
    benchmarks = value.get("benchmarks", [])
    if not isinstance(benchmarks, list) or not all(isinstance(b, str) and b for b in benchmarks):
        fail(f"{at}.benchmarks", f"expected a list of benchmark names, got {benchmarks!r}")
    if len(set(benchmarks)) != len(benchmarks):
        fail(f"{at}.benchmarks", f"duplicate benchmarks in {benchmarks!r}")
    return Quantity(kind, score=m.group(1), k=int(m.group(2)), benchmarks=tuple(benchmarks))


def _metric_quantity(value: dict, at: str, fail: Fail) -> Quantity:
    metric = value["metric"]
    if not isinstance(metric, str) or not metric:
        fail(f"{at}.metric", f"expected a metric name of metrics.jsonl (e.g. entropy), got {metric!r}")
    when = [k for k in ("at", "steps", "last_steps") if k in value]
    if len(when) != 1:
        fail(at, "say when: at: last, steps: [first, last] (a window's mean) or last_steps: N")
    if "at" in value and value["at"] != "last":
        fail(f"{at}.at", f"{value['at']!r}: the only point is `last` (a window: steps: [first, last])")
    steps, last = None, 0
    if "steps" in value:
        s = value["steps"]
        if not (isinstance(s, list) and len(s) == 2 and all(_is_int(x) and x >= 0 for x in s) and s[0] <= s[1]):
            fail(f"{at}.steps", f"expected [first, last] steps, 0 ≤ first ≤ last, got {s!r}")
        steps = (int(s[0]), int(s[1]))
    if "last_steps" in value:
        last = value["last_steps"]
        if not _is_int(last) or last < 1:
            fail(f"{at}.last_steps", f"expected a number of steps ≥ 1, got {last!r}")
    return Quantity("metric", metric=metric, steps=steps, last_steps=int(last))


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _margin(value: Any, quantity: Quantity, at: str, fail: Fail, what: str = "margin") -> float:
    m = _MARGIN.match(str(value)) if isinstance(value, str) else None
    if m is None:
        fail(at, f"{value!r}: a {what} carries its unit, e.g. '{value} {quantity.unit}' (the unit of {quantity.name})")
    number, word = float(m.group(1)), m.group(2).lower()
    unit = next((u for u, words in UNITS.items() if word in words), word)
    if unit != quantity.unit:
        fail(at, f"{value!r}: {quantity.name} is in {quantity.unit}, not {word}")
    if not math.isfinite(number) or number < 0:
        fail(at, f"{value!r}: a {what} is a finite number ≥ 0")
    return number


def _fraction(value: Any, at: str, fail: Fail) -> float:
    if value is None:
        fail(at, "missing: the fraction f of B's gain over base (e.g. fraction: 0.5)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        fail(at, f"{value!r}: expected a number ≥ 0 (f in A − base ≥ f·(B − base); no unit)")
    return float(value)


def check_claims(claims: list[Claim], flat: list[dict], controls: list[str], where: str) -> None:
    """Refuse (SweepError, one line) a claim the planned runs (resolved configs, flat: analysis.arms.flatten)
    can not decide:
    an arm not in the sweep, a benchmark or n the arms are not evaluated with, a metric they do not log,
    a spread or a training metric with too few seeds."""
    by_arm: dict[str, list[dict]] = {}
    for arm, cfg in zip(arm_names(flat), flat, strict=True):
        by_arm.setdefault(arm, []).append(cfg)
    known = list(by_arm) + [c for c in controls if c not in by_arm]
    for i, claim in enumerate(claims):
        fail = _failer(f"{where}: claims[{i}]", claim.id)

        for key, arm in zip(("a", "b", "base"), claim.arms, strict=False):
            if arm not in known:
                hint = f" (declare it: controls: [{arm}])" if arm in CONTROL_ARMS else ""
                fail(key, f"arm {arm!r} is not in the sweep{hint}; arms: {', '.join(known)}")
        runs = {arm: by_arm.get(arm, []) for arm in claim.arms}  # controls' runs are planned runs too
        if claim.quantity.kind == "metric":
            _check_metric(claim, runs, fail)
        else:
            _check_score(claim, runs, fail)


def _failer(at: str, cid: str) -> Fail:
    def fail(key: str, msg: str) -> NoReturn:
        raise SweepError(f"{at}{'.' + key if key else ''} ({cid}): {msg}")

    return fail


def _check_metric(claim: Claim, runs: dict[str, list[dict]], fail: Fail) -> None:
    metric = claim.quantity.metric
    for arm, cfgs in runs.items():
        if arm == "base" or any(c.get("trainer.max_steps") == 0 for c in cfgs):
            fail("quantity.metric", f"arm {arm!r} is not trained: it logs no training metrics")
        if 0 < len(cfgs) < 2:
            fail("quantity", f"arm {arm!r} has {len(cfgs)} seed; a training metric is compared over ≥ 2 seeds per arm")
        if metric in GEOMETRY:
            off = [c for c in cfgs if not (c.get("trainer.grad_geometry_every") or 0) > 0]
            if off:
                fail("quantity.metric", f"arm {arm!r} does not log {metric}: set trainer.grad_geometry_every > 0")
    if metric not in ALWAYS_LOGGED + GEOMETRY and not metric.startswith("rule/"):
        fail(
            "quantity.metric",
            f"{metric!r} is not logged by the runs; logged: {', '.join(ALWAYS_LOGGED + GEOMETRY)}, and a rule's rule/*",
        )


def _check_score(claim: Claim, runs: dict[str, list[dict]], fail: Fail) -> None:
    q = claim.quantity
    for arm, cfgs in runs.items():
        if q.kind == "spread" and 0 < len(cfgs) < 3:
            fail("quantity", f"arm {arm!r} has {len(cfgs)} seeds; a seed spread needs ≥ 3 seeds per arm")
        for cfg in cfgs:
            if cfg.get("eval.enabled") is False:
                fail("quantity", f"arm {arm!r} is not evaluated (eval: false)")
            evaluated = _json_list(cfg.get("eval.benchmarks"))
            missing = [b for b in q.benchmarks if evaluated is not None and b not in evaluated]
            if missing:
                on = ", ".join(evaluated or [])
                fail("quantity.benchmarks", f"arm {arm!r} is not evaluated on {missing[0]!r}; it is on {on}")
            n = cfg.get("eval.n")
            if _is_int(n) and q.score == "avg" and q.k != n:
                fail(f"quantity.{q.kind}", f"{q.score}@{q.k}: arm {arm!r} draws n = {n} samples per problem (avg@{n})")
            if _is_int(n) and q.score == "pass" and q.k > n:
                fail("quantity.score", f"pass@{q.k}: arm {arm!r} draws n = {n} samples per problem (k ≤ n)")


def _json_list(value: Any) -> list[str] | None:
    try:
        out = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return None
    return [str(x) for x in out] if isinstance(out, list) else None
