"""`stare-lab sweep run --until-decided`: the `design:` block's refusals, the looks adding seeds only to
the arms of open claims, a kill inside a look resumed without losing or repeating a run, the budget's
stop, the dry run's plan; the decisions read records written as runs write them (claims_fixtures), and
one real sweep of the built-in model runs its looks through the local launcher."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from claims_fixtures import _label, _write_run, simulate_problems, sweep_file

from stare_lab.cli.sweep import main
from stare_lab.plan.expand import expand_sweep
from stare_lab.plan.schema import SweepError, parse_sweep
from stare_lab.record import read_status, write_status
from stare_lab.sweep.sequential import Budget, planned_runs, sequential_state
from stare_lab.sweep.until_decided import run_until_decided

SCORE = {"score": "avg@32", "benchmarks": ["arithmetic"]}
ARMS = {a: {"method": a} for a in ("full", "stare", "low_entropy")}
CLAIMS = [
    {"id": "stare_beats_full", "source": "own", "form": "superiority", "a": "stare", "b": "full", "quantity": SCORE},
    {"id": "low_below_full", "source": "own", "form": "inferiority", "a": "low_entropy", "b": "full",
     "quantity": SCORE},
]  # fmt: skip
DESIGN = {"looks": [3, 6, 9], "alpha": 0.05, "spending": "obf"}
DURATION = {"full": 60.0, "stare": 90.0, "low_entropy": 120.0}  # each arm's recorded run time (s)
# stare far above full (decided at look 1); low_entropy 0.3 points below full (still open at look 1)
EFFECTS = {"full": 10.0, "stare": 40.0, "low_entropy": 9.7}


def _spec(path):
    return parse_sweep(yaml.safe_load(path.read_text()), where=str(path), folder=path.parent)


def _design_sweep(tmp_path, design=DESIGN, claims=CLAIMS, **extra):
    return sweep_file(tmp_path, "seq", ARMS, list(range(design["looks"][-1])) if "looks" in design else None,
                      claims, design=design, **extra)  # fmt: skip


class Recorder:
    """The look's launch as the records see it: each unfinished run gets the records a finished run of its
    arm writes (claims_fixtures), from one simulation of every arm at every seed; `stop_after` ends the
    launch after that many runs as a kill would (the rest stay unstarted)."""

    def __init__(self, problems, stop_after=None):
        self.problems, self.stop_after, self.launched = problems, stop_after, []

    def __call__(self, runs):
        for r in runs:
            if (read_status(r.run_dir) or {}).get("state") == "finished":
                continue
            if self.stop_after is not None and len(self.launched) >= self.stop_after:
                raise KeyboardInterrupt
            _write_run(r.run_dir, r.config, _label(r), self.problems, None)
            write_status(r.run_dir, {**read_status(r.run_dir), "duration_s": DURATION[_label(r)]})
            self.launched.append((_label(r), r.config["seed"]))
        return True


def _problems(seeds=9):
    return simulate_problems(EFFECTS, np.random.default_rng(4), seeds=seeds, problems=80, seed_sd=0.01)


@pytest.mark.parametrize(
    ("design", "message"),
    [
        ({"looks": [3, 6], "spendng": "obf"}, "design: unknown key 'spendng'"),
        ({"looks": [6, 3]}, "design.looks: looks [6, 3]: seeds per arm must increase strictly"),
        ({"looks": [1, 3]}, "the first look needs at least 2 seeds per arm"),
        ({"max_seeds": 16}, "design: missing 'schedule'"),
        ({"max_seeds": 8, "schedule": [0.5, 0.55, 1]}, "of 8 seeds gives looks [4, 4, 8]: they must increase"),
        ({"looks": [3, 6], "spending": "obrien"}, "design.spending: unknown spending 'obrien'; valid: obf, pocock"),
        ({"looks": [3, 6], "spending": "hsd"}, "design.gamma: spending hsd needs gamma"),
        ({"looks": [3, 6], "futility": 0.1}, "stare_beats_full needs a target"),
        ({"looks": [3, 6], "alpha": 1.5}, "design.alpha: 1.5: expected a level in (0, 1)"),
        (
            {"looks": [3, 6], "futility_from": 2},
            "design.futility_from: 2: expected the first look (1-based) at which futility may stop a claim, 1 … 1",
        ),
        (
            {"looks": [2, 4, 6], "futility_from": 2},
            "design.futility_from: 2 reads a futility threshold: give futility:",
        ),
        ({"looks": [2, 4, 6], "futility_from": "2"}, "design.futility_from: '2': expected the first look"),
    ],
)
def test_a_bad_design_is_one_line_naming_its_key(tmp_path, design, message):
    path = sweep_file(tmp_path, "seq", ARMS, [0, 1, 2, 3, 4, 5], CLAIMS, design=design)
    if "looks" not in design:
        data = yaml.safe_load(path.read_text())
        del data["seeds"]
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SweepError, match=None) as e:
        _spec(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_seeds_must_match_the_last_look_and_flags_need_a_design(tmp_path, capsys):
    path = sweep_file(tmp_path, "seq", ARMS, [0, 1, 2], CLAIMS, design=DESIGN)
    with pytest.raises(SweepError, match="3 seeds; the design's last look runs 9 per arm"):
        _spec(path)
    plain = sweep_file(tmp_path, "plain", ARMS, [0, 1], CLAIMS)
    assert main(["run", str(plain), "--until-decided"]) == 2
    assert "has no design:" in capsys.readouterr().err
    assert main(["run", str(plain), "--budget", "10"]) == 2
    assert "--budget: only with --until-decided" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing launched, nothing written
    with pytest.raises(SweepError, match="expected a number of runs"):
        Budget.parse("ten")
    assert Budget.parse("90m") == Budget(hours=1.5) and Budget.parse("12") == Budget(runs=12)


def test_looks_add_seeds_only_to_the_arms_of_open_claims(tmp_path):
    path = _design_sweep(tmp_path)
    spec = _spec(path)
    runs = expand_sweep(spec)
    launch = Recorder(_problems())
    lines: list[str] = []
    assert run_until_decided(spec, runs, launch, None, lines.append) == 0
    look1 = launch.launched[:9]
    assert sorted(look1) == sorted((a, s) for a in ARMS for s in range(3))
    later = launch.launched[9:]
    # stare_beats_full is decided at look 1: stare gets no more seeds; full and low_entropy do
    assert later and {a for a, _ in later} == {"full", "low_entropy"}
    assert all(s >= 3 for _, s in later)
    state = sequential_state(spec, planned_runs(spec, {r.id: _flat(r) for r in runs}))
    by_id = {c.id: c for c in state.decision.claims}
    assert by_id["stare_beats_full"].state == "supported" and by_id["stare_beats_full"].look == 1
    assert len(state.spent()) == len(launch.launched) < state.fixed_runs == 27
    assert any(line.startswith("done: no claim open") for line in lines)


def test_a_kill_inside_a_look_resumes_without_losing_or_repeating_a_run(tmp_path):
    path = _design_sweep(tmp_path)
    spec = _spec(path)
    runs = expand_sweep(spec)
    problems = _problems()
    killed = Recorder(problems, stop_after=11)  # look 1's 9 runs, then 2 of look 2's
    with pytest.raises(KeyboardInterrupt):
        run_until_decided(spec, runs, killed, None, lambda s: None)
    stamps = {
        r.id: (r.run_dir / "status.json").stat().st_mtime_ns for r in runs if (r.run_dir / "status.json").exists()
    }
    assert len(stamps) == 11
    again = Recorder(problems)
    assert run_until_decided(_spec(path), expand_sweep(_spec(path)), again, None, lambda s: None) == 0
    assert not set(killed.launched) & set(again.launched)  # nothing run twice
    whole = Recorder(problems)
    run_until_decided(_spec(path), expand_sweep(_spec(path)), whole, None, lambda s: None)
    assert whole.launched == []  # done: a third call starts nothing
    by_id = {r.id: r for r in runs}
    assert {i: (by_id[i].run_dir / "status.json").stat().st_mtime_ns for i in stamps} == stamps  # none rewritten
    (tmp_path / "b").mkdir()
    fresh_path = sweep_file(tmp_path / "b", "seq", ARMS, list(range(9)), CLAIMS, design=DESIGN)
    uninterrupted = Recorder(problems)
    run_until_decided(_spec(fresh_path), expand_sweep(_spec(fresh_path)), uninterrupted, None, lambda s: None)
    assert sorted(killed.launched + again.launched) == sorted(uninterrupted.launched)


def test_the_budget_stops_before_a_look_it_can_not_pay_for(tmp_path):
    path = _design_sweep(tmp_path)
    spec = _spec(path)
    launch = Recorder(_problems())
    lines: list[str] = []
    assert run_until_decided(spec, expand_sweep(spec), launch, Budget(runs=12), lines.append) == 0
    assert len(launch.launched) == 9  # look 1; look 2 adds 6 runs (2 arms × 3 seeds) > 12 − 9
    assert "budget: look 2 needs 6 more runs and 9 of 12 are spent; stopped with 1 claim(s) open" in lines[-1]


def test_the_dry_run_prints_each_claims_state_and_the_next_looks_runs(tmp_path, capsys):
    path = _design_sweep(tmp_path)
    spec = _spec(path)
    Recorder(_problems())([r for r in expand_sweep(spec) if r.config["seed"] < 3])
    assert main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "after look 1 of 3 (3 seeds per arm): 9 runs of the design finished; "
        "the fixed design runs 9 seeds × 3 arms = 27" in out
    )
    stare = next(line for line in out.splitlines() if line.strip().startswith("stare_beats_full"))
    assert "supported at look 1" in stare
    low = next(line for line in out.splitlines() if line.strip().startswith("low_below_full"))
    assert "open" in low and "+3 per arm (→ 6)" in low
    # 3 runs of each arm to start, each estimated from its arm's recorded times: 3 × 60 s + 3 × 120 s
    assert (
        "next: look 2 of 3 (local): low_entropy, full at 6 seeds per arm, 12 runs (6 finished); 6 runs to start, "
        "≈ 0.15 run-hours (≈ 270 s of wall time at 2 at once; from 9 finished runs' recorded times)"
    ) in out


def _flat(run):
    from stare_lab.record.arms import flatten

    return flatten(run.config)


def test_a_real_sweep_runs_its_looks_through_the_local_launcher(tmp_path):
    from sweep_fixtures import sweep_run, write_sweep

    claim = {"id": "full_beats_random", "source": "own", "form": "superiority", "a": "full", "b": "random",
             "quantity": {"score": "avg@2"}}  # fmt: skip
    path = write_sweep(
        tmp_path,
        "real",
        variants={"full": {"method": "full"}, "random": {"method": "random"}},
        seeds=[0, 1, 2],
        claims=[claim],
        design={"looks": [2, 3]},
        launcher={"name": "local", "workers": 2},
    )
    done = sweep_run(path, "--until-decided", "--budget", "6")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    spec = _spec(path)
    statuses = [read_status(r.run_dir) or {} for r in expand_sweep(spec)]
    finished = sum(s.get("state") == "finished" for s in statuses)
    assert "before look 1: 0 runs of the design finished; the fixed design runs 3 seeds × 2 arms = 6" in out
    if "after look 1 of 2 (2 seeds per arm): 4 runs of the design finished" in out and finished == 4:
        assert "done: no claim open" in out  # decided at look 1 (the claim's arms get no third seed)
    else:
        assert finished == 6 and "after look 2 of 2 (3 seeds per arm): 6 runs of the design finished" in out
    again = sweep_run(path, "--until-decided")
    assert again.returncode == 0 and "launching" not in again.stdout  # nothing left to run


def test_the_file_and_the_statistics_accept_the_same_designs():
    from stare_lab.analysis import sequential as stats
    from stare_lab.plan import design as block

    assert (block.SPENDING, block.FUTILITY_UNDER, block.DIRECTIONS) == (
        stats.SPENDING,
        stats.FUTILITY_UNDER,
        stats.DIRECTIONS,
    )
    assert block.schedule_looks(32, [0.125, 0.25, 0.5, 1.0]) == ((4, 8, 16, 32), "")
    assert (
        block.Design(looks=(4, 8)).futility_from
        == stats.SequentialDesign((stats.SequentialClaim("c", 1.0),), (4, 8)).futility_from
        == 1
    )
    assert stats.looks_from_schedule(32, (0.125, 0.25, 0.5, 1.0)) == (4, 8, 16, 32)
