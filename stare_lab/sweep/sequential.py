"""A sweep decided in looks: `stare-lab sweep run FILE --until-decided [--budget N|Nh]` (docs/claims.md).

The sweep's `design:` (stare_lab.plan.design) gives the seeds per arm at each look, n_1 < … < n_K. Look 1
runs the first n_1 seeds of every arm of the sweep; the claims are then decided by the design
(stare_lab.analysis.sequential.decide: error spending and the graph over the claims), each claim's statistic
computed as `stare-lab claims` computes it (analysis.verdicts: the seeds × problems t, Welch, Brown-Forsythe,
at the claim's one-sided p); look k + 1 brings only the arms an open claim reads (controls included) to
n_{k+1} seeds; and so on until no claim is open (supported, contradicted, futile, or undecided at the last
look) or the budget is spent. Each look is one launch of the grid sweep's machinery (stare_lab.sweep.launch:
on Slurm one array submission).

**State from the records.** `sequential_state` recomputes everything from the runs' records and the design:
a look is complete when every run of it (its arms at its seeds) is finished, its statistics read exactly
those runs (never a later seed already on disk), and the decision is recomputed from look 1. Nothing else is
stored, so a kill at any point (between looks, or inside one) loses nothing: the next invocation finds the
same complete looks, and the launch skips finished runs and resumes interrupted ones.

**Cost of a look** (`LookCost`): its runs still to start, and their hours estimated from the finished runs'
recorded wall times (status.json `duration_s`: the worker's time, without start-up or queueing), each arm
from its own finished runs where it has some, else from all of them; GPU-hours where the runs have GPUs (the
launcher's GPUs per run, else the GPUs the finished runs used). With no finished run the hours are not
estimated. A budget in hours counts the same unit: GPU-hours where runs have GPUs, run-hours otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from stare_lab.analysis.hypotheses import Outcome
from stare_lab.analysis.sequential import ClaimLook, Decision, SequentialClaim, SequentialDesign, decide
from stare_lab.analysis.verdicts import claim_outcome, sweep_frames
from stare_lab.launchers.errors import SweepError
from stare_lab.plan.claims import Claim
from stare_lab.plan.design import Design
from stare_lab.plan.schema import SweepSpec
from stare_lab.record import read_status
from stare_lab.record.arms import arm_names

_GPU_DEVICE = re.compile(r"^\d+ x ")  # provenance "device" of a run on GPUs: "2 x NVIDIA H100 80GB HBM3"


@dataclass(frozen=True)
class Planned:
    """A run of the sweep's plan as the design sees it: its arm and its seed's place in `seeds:`."""

    id: str
    arm: str
    rank: int  # look k runs the ranks < n_k
    run_dir: Path


@dataclass
class Look:
    index: int  # 0-based
    seeds: int  # per arm
    arms: tuple[str, ...]
    runs: list[Planned]
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # the claims measured at it (complete looks)


@dataclass
class SequentialState:
    """The complete looks, the design's decision after them (None before look 1), the next look to run
    (None: no claim open) and every planned run's status."""

    spec: SweepSpec
    looks: list[Look]
    decision: Decision | None
    next: Look | None
    statuses: dict[str, dict]
    arms: tuple[str, ...]  # every arm of the sweep

    @property
    def design(self) -> Design:
        assert self.spec.design is not None
        return self.spec.design

    def finished(self, run: Planned) -> bool:
        return self.statuses.get(run.id, {}).get("state") == "finished"

    def spent(self) -> list[Planned]:
        """The finished runs of the looks so far (the next one's included)."""
        runs = [r for look in self.looks + ([self.next] if self.next else []) for r in look.runs]
        return [r for r in dict.fromkeys(runs) if self.finished(r)]

    @property
    def fixed_runs(self) -> int:
        """The fixed design's runs: every arm at the last look's seeds."""
        return self.design.max_seeds * len(self.arms)


def sequential_design(spec: SweepSpec) -> SequentialDesign:
    """The statistics' design (analysis.sequential) of the sweep's `design:` and claims."""
    d = spec.design
    assert d is not None
    claims = tuple(SequentialClaim(c.id, d.targets.get(c.id), c.arms) for c in spec.claims)
    return SequentialDesign(
        claims=claims,
        looks=d.looks,
        alpha=d.alpha,
        spending=d.spending,
        gamma=d.gamma,
        futility=d.futility,
        futility_under=d.futility_under,
        futility_from=d.futility_from,
        directions=d.directions,
    )


def planned_runs(spec: SweepSpec, flats: dict[str, dict]) -> list[Planned]:
    """{run folder name: flat resolved config} of the plan → the planned runs, arms named as the tables name
    them over the whole plan (stare_lab.record.arms), seeds outside `seeds:` ranked past every look."""
    rank = {s: i for i, s in enumerate(spec.seeds)}
    names = arm_names(list(flats.values()))
    return [
        Planned(run_id, arm, rank.get(flat.get("seed", -1), len(spec.seeds)), spec.folder / run_id)
        for (run_id, flat), arm in zip(flats.items(), names, strict=True)
    ]


def sequential_state(spec: SweepSpec, planned: list[Planned]) -> SequentialState:
    """The design's looks recomputed from the records (module docstring)."""
    design = sequential_design(spec)
    statuses = {p.id: read_status(p.run_dir) or {} for p in planned}
    arms = tuple(dict.fromkeys(p.arm for p in planned))
    state = SequentialState(spec, [], None, None, statuses, arms)
    frames = None
    look_arms, stats = arms, []
    for k, n in enumerate(design.looks):
        look = Look(k, n, look_arms, [p for p in planned if p.arm in look_arms and p.rank < n])
        if not all(state.finished(r) for r in look.runs):
            state.next = look
            return state
        # read once, when look 1 is complete: every arm has finished runs, so the records name the arms as
        # the plan does (arm_names splits a label over the runs it is given)
        frames = frames or _frames(spec, planned, state)
        open_ids = state.decision.open if state.decision else tuple(c.id for c in spec.claims)
        look.outcomes = {c.id: _outcome(c, frames, look, spec.design) for c in spec.claims if c.id in open_ids}
        stats.append({cid: ClaimLook.from_p_value(o.p_support, o.se, o.effect) for cid, o in look.outcomes.items()})
        state.looks.append(look)
        state.decision = decide(design, stats)
        if state.decision.done:
            return state
        look_arms = state.decision.arms
    return state


def _frames(spec: SweepSpec, planned: list[Planned], state: SequentialState):
    within = [p.run_dir for p in planned if p.rank < len(spec.seeds) and state.finished(p)]
    problems, training, _ = sweep_frames(within, spec.claims)
    return problems, training


def _outcome(claim: Claim, frames, look: Look, design: Design | None) -> Outcome:
    problems, training = frames
    ids = {r.id for r in look.runs}
    rows = problems[problems["run"].isin(ids)] if len(problems) else problems
    train = training[training["run"].isin(ids)] if len(training) else training
    out = claim_outcome(claim, rows, train, design.alpha if design else 0.05)
    if isinstance(out, str):
        raise SweepError(f"look {look.index + 1}: claim {claim.id} can not be decided from its runs: {out}")
    return out


# -- cost and budget ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LookCost:
    runs: int  # still to start
    seconds: float | None  # their estimated run time, summed (None: no finished run to estimate from)
    based_on: int  # finished runs the estimate reads
    gpus: int  # per run (0: none)
    parallel: int  # runs at once on the launcher

    @property
    def hours(self) -> float | None:
        """Run-hours, or GPU-hours where the runs have GPUs (the budget's unit)."""
        return None if self.seconds is None else self.seconds * max(self.gpus, 1) / 3600

    @property
    def elapsed_hours(self) -> float | None:
        if self.seconds is None or not self.runs:
            return None if self.seconds is None else 0.0
        return self.seconds / min(self.parallel, self.runs) / 3600


def look_cost(state: SequentialState, look: Look) -> LookCost:
    durations: dict[str, list[float]] = {}
    gpus: list[int] = []
    for run in _every_run(state):
        status = state.statuses[run.id]
        if status.get("state") == "finished" and float(status.get("duration_s") or 0) > 0:
            durations.setdefault(run.arm, []).append(float(status["duration_s"]))
            gpus.append(run_gpus(status))
    todo = [r for r in look.runs if not state.finished(r)]
    everything = [d for ds in durations.values() for d in ds]
    seconds = None
    if everything:
        overall = sum(everything) / len(everything)
        seconds = sum(sum(durations[r.arm]) / len(durations[r.arm]) if r.arm in durations else overall for r in todo)
    launcher = state.spec.launcher
    per_run = launcher.gpus_per_run or (sorted(gpus)[len(gpus) // 2] if gpus else 0)
    return LookCost(len(todo), seconds, len(everything), per_run, launcher.parallel_runs)


def _every_run(state: SequentialState) -> list[Planned]:
    runs = [r for look in state.looks + ([state.next] if state.next else []) for r in look.runs]
    return list(dict.fromkeys(runs))


def run_gpus(status: dict) -> int:
    """GPUs a finished run used: its training processes where its device was a GPU (one each), else 0."""
    device = str(((status.get("provenance") or [{}])[-1] or {}).get("device") or "")
    return int(status.get("world_size") or 1) if _GPU_DEVICE.match(device) else 0


def spent_hours(state: SequentialState) -> float:
    """The budget's hours of the finished runs of the looks so far (GPU-hours on GPUs, else run-hours)."""
    total = 0.0
    for run in state.spent():
        status = state.statuses[run.id]
        total += float(status.get("duration_s") or 0) * max(run_gpus(status), 1) / 3600
    return total


@dataclass(frozen=True)
class Budget:
    """`--budget N` (runs of the design, all looks) or `--budget 3h` / `90m` (hours: module docstring)."""

    runs: int | None = None
    hours: float | None = None

    @staticmethod
    def parse(text: str) -> Budget:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(h|m|min)?\s*", text)
        if m is None or (m.group(2) is None and "." in m.group(1)):
            raise SweepError(f"--budget {text!r}: expected a number of runs (e.g. 200) or hours (e.g. 3h, 90m)")
        value = float(m.group(1))
        if not value > 0:
            raise SweepError(f"--budget {text!r}: expected a budget > 0")
        if m.group(2) is None:
            return Budget(runs=int(value))
        return Budget(hours=value if m.group(2) == "h" else value / 60)

    def stop(self, state: SequentialState, cost: LookCost) -> str | None:
        """Why the next look is not started within the budget, or None."""
        assert state.next is not None
        k = state.next.index + 1
        if self.runs is not None:
            spent = len(state.spent())
            if spent + cost.runs > self.runs:
                return (
                    f"budget: look {k} needs {cost.runs} more runs and {spent} of {self.runs} are spent; "
                    f"stopped with {_open_count(state)} claim(s) open (a budget of {spent + cost.runs} runs runs it)"
                )
        if self.hours is not None and cost.hours is not None:
            spent_h = spent_hours(state)
            if spent_h + cost.hours > self.hours:
                return (
                    f"budget: look {k} needs ≈ {hours_text(cost.hours)} more and {hours_text(spent_h)} of "
                    f"{hours_text(self.hours)} are spent; stopped with {_open_count(state)} claim(s) open"
                )
        return None


def _open_count(state: SequentialState) -> int:
    return len(state.decision.open) if state.decision else len(state.spec.claims)


def hours_text(h: float) -> str:
    return f"{h:.3g} h" if h >= 0.1 else f"{h * 3600:.3g} s"
