"""A sweep's sequential design: the `design:` block that decides its claims in looks (docs/claims.md).

    design:
      looks: [4, 8, 16, 32]        # seeds per arm at each look (or max_seeds: 32 + schedule: [0.125, 0.25, 0.5, 1])
      alpha: 0.05                  # the familywise error over all claims, looks and both verdicts
      spending: obf                # obf | pocock | hsd (with gamma)
      futility: 0.1                # an open claim whose conditional power at the last look is below it stops
      futility_under: target       # target (each claim's `target:`) | estimate
      futility_from: 1             # the first look (1-based) at which futility may stop a claim
      directions: both             # both (supported or contradicted) | support

`stare-lab sweep run --until-decided` runs the looks (stare_lab.sweep.sequential); the statistics are
stare_lab.analysis.sequential's, which checks the same values again when it builds the design (a test keeps
SPENDING, FUTILITY_UNDER and DIRECTIONS equal to its own). Look k runs the first n_k seeds of the sweep's
`seeds:` (default 0 … n_K − 1; a list given must hold n_K seeds). Every mistake is one `SweepError` line
naming the key. Pure Python: a refusal imports no numpy, pandas or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from stare_lab.plan.claims import Claim, Fail

DESIGN_KEYS = (
    "looks",
    "max_seeds",
    "schedule",
    "alpha",
    "spending",
    "gamma",
    "futility",
    "futility_under",
    "futility_from",
    "directions",
)
SPENDING = ("obf", "pocock", "hsd")
FUTILITY_UNDER = ("target", "estimate")
DIRECTIONS = ("both", "support")
SPENDING_NAMES = {
    "obf": "Lan-DeMets O'Brien-Fleming-type",
    "pocock": "Lan-DeMets Pocock-type",
    "hsd": "Hwang-Shih-DeCani",
}


@dataclass(frozen=True)
class Design:
    looks: tuple[int, ...]  # seeds per arm at each look, increasing
    alpha: float = 0.05
    spending: str = "obf"
    gamma: float | None = None  # hsd only
    futility: float = 0.0  # conditional-power threshold; 0: no futility stop
    futility_under: str = "target"
    futility_from: int = 1  # the first look (1-based) whose conditional power may stop a claim
    directions: str = "both"
    targets: dict[str, float] = field(default_factory=dict)  # claim id → its `target:` (the claim's unit)

    @property
    def max_seeds(self) -> int:
        return self.looks[-1]

    def describe(self) -> str:
        """One line: "looks at 4, 8, 16, 32 seeds per arm; Lan-DeMets O'Brien-Fleming-type spending, α = 0.05 …"."""
        spend = SPENDING_NAMES[self.spending] + (f" (γ = {self.gamma:g})" if self.gamma is not None else "")
        sides = "both verdicts" if self.directions == "both" else "supported only"
        futile = (
            f"futility: conditional power at the last look < {self.futility:g} under the "
            + ("claim's target" if self.futility_under == "target" else "current estimate")
            + (f", from look {self.futility_from}" if self.futility_from > 1 else "")
            if self.futility > 0
            else "no futility stop"
        )
        return (
            f"looks at {', '.join(map(str, self.looks))} seeds per arm; {spend} spending, α = {self.alpha:g} "
            f"familywise over the claims, every look and {sides} (Maurer & Bretz graph, Holm's weights); {futile}"
        )


def schedule_looks(maximum: int, fractions: list[float]) -> tuple[tuple[int, ...], str]:
    """(the seeds per arm at each look, "") from a maximum and fractions ending at 1, or ((), the problem):
    (32, [1/8, 1/4, 1/2, 1]) → (4, 8, 16, 32). analysis.sequential.looks_from_schedule is this rule."""
    if not fractions or not math.isclose(fractions[-1], 1.0):
        return (), f"the fractions must end at 1 (the maximum, {maximum} seeds), got {fractions}"
    looks = tuple(round(f * maximum) for f in fractions)
    if any(b <= a for a, b in zip(looks, looks[1:], strict=False)):
        return (), f"{fractions} of {maximum} seeds gives looks {list(looks)}: they must increase"
    return looks, ""


def parse_design(block: Any, claims: list[Claim], fail: Fail) -> Design | None:
    """The `design:` block checked alone and against the file's claims (None without one)."""
    if block is None:
        _no_targets(claims, fail)
        return None
    if not isinstance(block, dict):
        fail("design", f"expected a mapping with keys {', '.join(DESIGN_KEYS)}, got {block!r}")
    for k in block:
        if k not in DESIGN_KEYS:
            fail("design", f"unknown key {k!r}; valid keys: {', '.join(DESIGN_KEYS)}")
    looks = _looks(block, fail)
    design = Design(
        looks=looks,
        alpha=_level(block.get("alpha", 0.05), "design.alpha", fail),
        spending=_choice(block, "spending", SPENDING, "obf", fail),
        gamma=_gamma(block, fail),
        futility=_futility(block.get("futility", 0.0), fail),
        futility_under=_choice(block, "futility_under", FUTILITY_UNDER, "target", fail),
        futility_from=_futility_from(block, len(looks), fail),
        directions=_choice(block, "directions", DIRECTIONS, "both", fail),
        targets={c.id: c.target for c in claims if c.target is not None},
    )
    _check_claims(design, claims, fail)
    return design


def design_seeds(design: Design, seeds: Any, fail: Fail) -> Any:
    """The sweep's `seeds:` under a design: absent, 0 … n_K − 1; given, exactly n_K of them."""
    n = design.max_seeds
    if seeds is None:
        return list(range(n))
    count = len(seeds) if isinstance(seeds, list) else seeds if _is_int(seeds) else None
    if count is not None and count != n:
        fail(
            "seeds",
            f"{count} seeds; the design's last look runs {n} per arm: give {n} (or leave seeds: out for 0-{n - 1})",
        )
    return seeds


def _looks(block: dict, fail: Fail) -> tuple[int, ...]:
    by_schedule = [k for k in ("max_seeds", "schedule") if k in block]
    if "looks" in block and by_schedule:
        fail("design", f"give looks: or max_seeds: with schedule:, not both (got looks and {by_schedule[0]})")
    if "looks" in block:
        looks = block["looks"]
        if not isinstance(looks, list) or not looks or not all(_is_int(n) for n in looks):
            fail(
                "design.looks",
                f"expected seeds per arm at each look, whole numbers, e.g. [4, 8, 16, 32]; got {looks!r}",
            )
        at = "design.looks"
    elif len(by_schedule) == 2:
        maximum, fractions = block["max_seeds"], block["schedule"]
        if not _is_int(maximum) or maximum < 2:
            fail(
                "design.max_seeds", f"expected the seeds per arm at the last look, a whole number ≥ 2; got {maximum!r}"
            )
        if not isinstance(fractions, list) or not all(_is_number(f) and 0 < f <= 1 for f in fractions):
            fail(
                "design.schedule", f"expected fractions of max_seeds in (0, 1], e.g. [0.25, 0.5, 1]; got {fractions!r}"
            )
        looks, problem = schedule_looks(maximum, [float(f) for f in fractions])
        if problem:
            fail("design.schedule", problem)
        at = "design.schedule"
    else:
        missing = "max_seeds" if "schedule" in block else "schedule" if "max_seeds" in block else "looks"
        fail("design", f"missing {missing!r}: give looks: [4, 8, 16, 32] (seeds per arm) or max_seeds: and schedule:")
    looks = tuple(int(n) for n in looks)
    if looks[0] < 2:
        fail(at, f"looks {list(looks)}: the first look needs at least 2 seeds per arm (a variance over seeds)")
    if any(b <= a for a, b in zip(looks, looks[1:], strict=False)):
        fail(at, f"looks {list(looks)}: seeds per arm must increase strictly from look to look")
    return looks


def _choice(block: dict, key: str, valid: tuple[str, ...], default: str, fail: Fail) -> str:
    value = block.get(key, default)
    if value not in valid:
        fail(f"design.{key}", f"unknown {key} {value!r}; valid: {', '.join(valid)}")
    return value


def _level(value: Any, at: str, fail: Fail) -> float:
    if not _is_number(value) or not 0 < value < 1:
        fail(at, f"{value!r}: expected a level in (0, 1), e.g. 0.05")
    return float(value)


def _gamma(block: dict, fail: Fail) -> float | None:
    spending, gamma = block.get("spending", "obf"), block.get("gamma")
    if spending == "hsd" and gamma is None:
        fail("design.gamma", "spending hsd needs gamma (e.g. -4: O'Brien-Fleming-like, 1: Pocock-like)")
    if spending != "hsd" and gamma is not None:
        fail("design.gamma", f"only spending hsd takes a gamma (spending is {spending})")
    if gamma is not None and not (_is_number(gamma) and math.isfinite(gamma)):
        fail("design.gamma", f"{gamma!r}: expected a finite number")
    return None if gamma is None else float(gamma)


def _futility(value: Any, fail: Fail) -> float:
    if not _is_number(value) or not 0 <= value < 1:
        fail("design.futility", f"{value!r}: expected a conditional-power threshold in [0, 1) (0: no futility stop)")
    return float(value)


def _futility_from(block: dict, n_looks: int, fail: Fail) -> int:
    """The first look at which futility may stop a claim: 1 … K − 1 (the last look decides or leaves open)."""
    value = block.get("futility_from", 1)
    last = max(1, n_looks - 1)
    if not _is_int(value) or not 1 <= value <= last:
        fail(
            "design.futility_from",
            f"{value!r}: expected the first look (1-based) at which futility may stop a claim, 1 … {last}",
        )
    if value > 1 and not block.get("futility"):
        fail("design.futility_from", f"{value} reads a futility threshold: give futility: (e.g. 0.1) or drop it")
    return int(value)


def _check_claims(design: Design, claims: list[Claim], fail: Fail) -> None:
    """A design decides every claim of the file: each one must have a single z-statistic, enough seeds at
    the first look, and a target where futility reads one."""
    if not claims:
        fail("design", "a sequential design decides the file's claims: declare them under claims:")
    needs_target = design.futility > 0 and design.futility_under == "target"
    for i, claim in enumerate(claims):
        at = f"claims[{i}]"
        if claim.form == "equivalence":
            fail(
                f"{at}.form",
                f"equivalence (TOST) has no single z-statistic, so a sequential design can not decide {claim.id}; "
                "write it as two non_inferiority claims or drop design:",
            )
        if claim.quantity.kind == "spread" and design.looks[0] < 3:
            fail("design.looks", f"the seed spread of {claim.id} ({at}) needs ≥ 3 seeds per arm at the first look")
        if needs_target and claim.target is None:
            fail(
                at,
                f"{claim.id} needs a target: futility under the target reads the effect beyond the bound the design "
                f"is powered for, e.g. target: 2 {claim.quantity.unit} (or futility_under: estimate)",
            )


def _no_targets(claims: list[Claim], fail: Fail) -> None:
    for i, claim in enumerate(claims):
        if claim.target is not None:
            fail(
                f"claims[{i}].target", f"a target is what a sequential design is powered for ({claim.id}): add design:"
            )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
