"""The loop of `stare-lab sweep run FILE --until-decided [--budget N|Nh]`: the design's looks, each one launch
of the runs an open claim still needs, the state recomputed from the records before each (the statistics
and the state: stare_lab.sweep.sequential; what each look prints: stare_lab.sweep.look_report)."""

from __future__ import annotations

from collections.abc import Callable

from stare_lab.plan.schema import SweepSpec
from stare_lab.record.arms import flatten
from stare_lab.sweep.look_report import describe
from stare_lab.sweep.sequential import Budget, look_cost, planned_runs, sequential_state


def run_until_decided(spec: SweepSpec, runs: list, launch: Callable[[list], bool], budget: Budget | None,
                      echo: Callable[[str], None]) -> int:  # fmt: skip
    """The design's looks until no claim is open or the budget stops it (0), or a look whose runs did not
    all finish (1: `sweep run --until-decided` again resumes it). `runs`: the plan's expanded runs (ids and
    configs); `launch(look_runs)` runs them (finished ones skipped) and says whether all finished. The state
    is recomputed from the records before every look, so nothing here survives a kill but the records."""
    by_id = {r.id: r for r in runs}
    planned = planned_runs(spec, {r.id: flatten(r.config) for r in runs})
    while True:
        state = sequential_state(spec, planned)
        for line in describe(state):
            echo(line)
        look = state.next
        if look is None:
            return 0
        if budget is not None:
            why = budget.stop(state, look_cost(state, look))
            if why:
                echo(why)
                return 0
        launch([by_id[p.id] for p in look.runs])
        after = sequential_state(spec, planned)
        if after.next is not None and after.next.index == look.index:
            left = sum(1 for p in look.runs if not after.finished(p))
            echo(
                f"look {look.index + 1}: {left} of its {len(look.runs)} runs did not finish; the claims are not "
                "decided on a partial look (`sweep run --until-decided` again resumes it)"
            )
            return 1
