"""What a sequential sweep says at each look and in its dry run: per claim its state, estimate, z, the
seeds it has and the seeds the next look adds, then the next look's cost (stare_lab.sweep.sequential)."""

from __future__ import annotations

import math

from stare_lab.analysis.claims_report import DesignSummary
from stare_lab.analysis.hypotheses import Outcome
from stare_lab.plan.claims import Claim
from stare_lab.sweep.sequential import LookCost, SequentialState, hours_text, look_cost

GAIN_FORMS = ("retained_gain", "gain_below")


def claim_rows(state: SequentialState) -> list[dict[str, str]]:
    """One row of text per claim: claim, state, look (decided at), estimate, z, CP, seeds, adds."""
    states = {c.id: c for c in state.decision.claims} if state.decision else {}
    nxt = state.next
    now = state.looks[-1].seeds if state.looks else 0
    rows = []
    for claim in state.spec.claims:
        cs = states.get(claim.id)
        measured = [look for look in state.looks if claim.id in look.outcomes]
        last = measured[-1] if measured else None
        is_open = cs is None or cs.state == "open"
        power = [p for p in (cs.conditional_power if cs else ()) if not math.isnan(p)]
        rows.append(
            {
                "claim": claim.id,
                "state": _state_text(cs.state if cs else "open", cs.look if cs else None),
                "look": str(cs.look) if cs and cs.look else "",
                "estimate": _estimate(last.outcomes[claim.id], claim) if last else "–",
                "z": fmt(cs.z) if cs and not math.isnan(cs.z) else "–",
                "CP": f"{max(power):.2f}" if power and is_open else "–",
                "seeds": ", ".join(f"{arm} {last.seeds}" for arm in claim.arms) if last else "–",
                "adds": f"+{nxt.seeds - now} per arm (→ {nxt.seeds})" if nxt and is_open else "–",
            }
        )
    return rows


def describe(state: SequentialState) -> list[str]:
    """The lines `--dry-run` and each look of `--until-decided` print."""
    design, k = state.design, len(state.looks)
    spent = len(state.spent())
    lines = [f"sequential design: {design.describe()}"]
    done = f"after look {k} of {len(design.looks)} ({state.looks[-1].seeds} seeds per arm)" if k else "before look 1"
    fixed = f"{fixed_text(state)} = {state.fixed_runs}"
    lines.append(f"{done}: {spent} runs of the design finished; the fixed design runs {fixed}")
    rows = claim_rows(state)
    heads = {"claim": "claim", "state": "state", "estimate": "estimate", "z": "z", "seeds": "seeds it has",
             "adds": "next look adds"}  # fmt: skip
    if design.futility > 0:
        heads = {**dict(list(heads.items())[:4]), "CP": "cond. power", **dict(list(heads.items())[4:])}
    lines += _aligned([dict(heads)] + [{k: r[k] for k in heads} for r in rows])
    nxt = state.next
    if nxt is None:
        counts: dict[str, int] = {}
        for cs in state.decision.claims if state.decision else ():
            counts[cs.state] = counts.get(cs.state, 0) + 1
        told = ", ".join(f"{n} {s}" for s, n in counts.items())
        lines.append(f"done: no claim open ({told}); {spent} runs against the fixed design's {state.fixed_runs}"
                     f" ({spent / state.fixed_runs:.0%})")  # fmt: skip
        return lines
    arms = ", ".join(nxt.arms)
    finished = sum(1 for r in nxt.runs if state.finished(r))
    lines.append(
        f"next: look {nxt.index + 1} of {len(design.looks)} ({state.spec.launcher.name}): {arms} at {nxt.seeds} seeds "
        f"per arm, {len(nxt.runs)} runs ({finished} finished); {elapsed_text(look_cost(state, nxt))}"
    )
    return lines


def design_summary(state: SequentialState) -> DesignSummary:
    """The design's section of `stare-lab claims` (analysis.claims_report)."""
    rows = {r["claim"]: r for r in claim_rows(state)}
    by_id = {c.id: c for c in state.decision.claims} if state.decision else {}
    states = {}
    for claim in state.spec.claims:
        cs = by_id.get(claim.id)
        states[claim.id] = (cs.state if cs else "open", cs.look if cs else None, rows[claim.id]["seeds"])
    return DesignSummary(
        description=state.design.describe(),
        looks_done=len(state.looks),
        looks=len(state.design.looks),
        states=states,
        spent=len(state.spent()),
        fixed=state.fixed_runs,
        fixed_text=fixed_text(state),
    )


def _state_text(state: str, look: int | None) -> str:
    if state in ("supported", "contradicted", "futile"):
        return f"{state} at look {look}"
    return "undecided at the last look" if state == "undecided" else "open"


def _estimate(out: Outcome, claim: Claim) -> str:
    if claim.form in GAIN_FORMS:
        return f"keeps {fmt(out.estimate).lstrip('+')} of the gain"
    return f"{fmt(out.estimate)} [{fmt(out.lo)}, {fmt(out.hi)}] {claim.quantity.unit}"


def _aligned(rows: list[dict[str, str]]) -> list[str]:
    keys = list(rows[0])
    widths = {k: max(len(r[k]) for r in rows) for k in keys}
    return ["  " + "  ".join(r[k].ljust(widths[k]) for k in keys).rstrip() for r in rows]


# -- text --------------------------------------------------------------------------------------------


def fmt(x: float) -> str:
    """A signed number as the look lines print it: +1.23, −0.40 (– where it is not a number)."""
    return "–" if x is None or math.isnan(x) else f"{x:+.2f}"


def fixed_text(state: SequentialState) -> str:
    """The fixed design's size in words: "32 seeds × 15 arms"."""
    return f"{state.design.max_seeds} seeds × {len(state.arms)} arms"


def elapsed_text(cost: LookCost) -> str:
    """A look's cost in words: its runs to start and their hours, or why the hours are not estimated."""
    if cost.runs == 0:
        return "nothing to start"
    if cost.hours is None:
        return f"{cost.runs} runs to start; hours not estimated (no finished run to estimate from)"
    unit = "GPU-hours" if cost.gpus else "run-hours"
    wall = cost.elapsed_hours or 0.0
    return (
        f"{cost.runs} runs to start, ≈ {cost.hours:.3g} {unit} (≈ {hours_text(wall)} of wall time at "
        f"{min(cost.parallel, cost.runs)} at once; from {cost.based_on} finished runs' recorded times)"
    )
