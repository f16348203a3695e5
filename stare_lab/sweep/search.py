"""Optuna search: a sweep's `search:` block as a study driven with ask/tell.

Each trial is an ordinary run (its config is the base plus the sampled parameters, its id the config
hash) launched through the sweep's launcher, at most `parallelism` at a time. Only this driver talks
to the study storage: the launcher's `study_file` in the sweep folder (sqlite for the local
launcher, a JournalStorage file, safe on a shared filesystem, for Slurm). A driver that dies leaves
its trials RUNNING in the storage; the next `sweep run` relaunches exactly those runs (they resume
from their checkpoints) before asking for new trials. With a pruner, the driver reads each running
trial's intermediate values (intermediate evaluations for an eval metric, metrics.jsonl rows for a
train metric), reports them, and stops a trial Optuna prunes (its run is recorded interrupted,
"pruned ..."). Ctrl-C stops the trials' jobs as a grid sweep's launch does (the launcher's one line;
local runs recorded interrupted) and leaves their trials RUNNING, so that `sweep run` resumes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stare_lab.launchers.errors import SweepError
from stare_lab.launchers.jobs import Tracked, reconcile, record_stopped, stop_job, submit_run
from stare_lab.launchers.run_spec import RunSpec
from stare_lab.plan.expand import Composer, fmt_value
from stare_lab.plan.run_plan import prepare
from stare_lab.plan.schema import SweepSpec
from stare_lab.plan.search_spec import SearchSpec
from stare_lab.record import eval_metric, read_eval_results, read_metrics, read_status, update_status
from stare_lab.sweep.launch import POLL_S, make_executor
from stare_lab.sweep.worker import RunWorker


def search_of(spec: SweepSpec) -> SearchSpec:
    """The sweep's `search:` block (the functions below are called for a search sweep only)."""
    if spec.search is None:
        raise SweepError(f"{spec.where()}: not a search sweep (no `search:` block)")
    return spec.search


def storage_for(spec: SweepSpec):
    """An Optuna storage object (or URL) for this sweep."""
    import optuna  # deferred: optuna, for a search sweep only

    s = search_of(spec).storage
    if s and "://" in s:
        return s
    if s:
        path = Path(s) if Path(s).is_absolute() else spec.folder / s
    else:
        path = spec.folder / spec.launcher.study_file
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        return f"sqlite:///{path}"
    from optuna.storages.journal import JournalFileBackend  # deferred: as above

    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


def load_study(spec: SweepSpec, create: bool = False):
    import optuna  # deferred: as in storage_for

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = search_of(spec)
    storage = storage_for(spec)
    if not create:
        return optuna.load_study(study_name=spec.name, storage=storage)
    pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
    if s.pruner.get("name") == "median":
        pruner = optuna.pruners.MedianPruner(
            n_startup_trials=int(s.pruner.get("n_startup_trials", 2)),
            n_warmup_steps=int(s.pruner.get("n_warmup_steps", 0)),
        )
    study = optuna.create_study(
        study_name=spec.name, storage=storage, load_if_exists=True, direction=s.direction, pruner=pruner
    )
    # A resumed study must not replay the first launch's suggestions: seed by trials so far.
    seed = s.seed + len(study.trials)
    study.sampler = (
        optuna.samplers.RandomSampler(seed=seed)
        if s.sampler == "random"
        else optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(1, s.trials // 3)))
    )
    return study


def distributions(s: SearchSpec) -> dict[str, Any]:
    from optuna.distributions import (  # deferred: optuna, as in storage_for
        BaseDistribution,
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, BaseDistribution] = {}
    for key, p in s.params.items():
        if "choices" in p:
            out[key] = CategoricalDistribution(p["choices"])
            continue
        kind = p.get("type") or ("float" if any(isinstance(p[k], float) for k in ("low", "high")) else "int")
        log = bool(p.get("log", False))
        if kind == "int":
            out[key] = IntDistribution(int(p["low"]), int(p["high"]), log=log, step=p.get("step", 1))
        else:
            out[key] = FloatDistribution(float(p["low"]), float(p["high"]), log=log, step=p.get("step"))
    return out


def objective_value(run_dir: Path, metric: str) -> float | None:
    """The objective of a finished run: eval/<benchmark>/<metric> or train/<key> (last row)."""
    kind, _, rest = metric.partition("/")
    if kind == "eval":
        bench, _, name = rest.partition("/")
        return eval_metric(run_dir, bench, name)
    rows = [r for r in read_metrics(run_dir) if rest in r]
    return float(rows[-1][rest]) if rows else None


def intermediate_values(run_dir: Path, metric: str) -> dict[int, float]:
    """step → value so far: intermediate evaluations (final=False), or metrics.jsonl rows."""
    kind, _, rest = metric.partition("/")
    if kind == "eval":
        bench, _, name = rest.partition("/")
        steps = {r["step"] for r in read_eval_results(run_dir) if not r["final"] and r["benchmark"] == bench}
        values = {step: eval_metric(run_dir, bench, name, step) for step in steps if step is not None}
        return {int(step): v for step, v in values.items() if v is not None}
    return {int(r["step"]): float(r[rest]) for r in read_metrics(run_dir) if rest in r}


def trial_run(composer: Composer, spec: SweepSpec, number: int, params: dict[str, Any]) -> RunSpec:
    assigned = [(k, v, f"search.params.{k}") for k, v in params.items()]
    label = f"trial {number}: " + " ".join(f"{k.rsplit('.', 1)[-1]}={fmt_value(v)}" for k, v in params.items())
    return composer.run(assigned, seed=spec.seeds[0], label=label, variant=None)


def run_search(spec: SweepSpec, echo: Callable[[str], None] = print) -> dict[str, int]:
    """Run the study until `trials` trials have ended; returns counts of trial states."""
    from optuna.trial import Trial, TrialState  # deferred: optuna, as in storage_for

    s = search_of(spec)
    study = load_study(spec, create=True)
    composer, dists = Composer(spec), distributions(s)
    executor, watch = make_executor(spec), spec.launcher.watch()
    worker = RunWorker(spec.launcher.worker_threads())
    stale = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    if stale:
        echo(f"resuming {len(stale)} trial(s) left running by an earlier launch")

    def ended() -> int:
        return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)))

    inflight: list[tuple[Trial, Tracked]] = []
    done = ended()
    echo(f"study {spec.name!r}: {done} of {s.trials} trials ended; up to {s.parallelism} at a time")
    try:
        while inflight or (stale or done + len(inflight) < s.trials):
            while len(inflight) < s.parallelism and (stale or done + len(inflight) < s.trials):
                if stale:
                    frozen = stale.pop(0)
                    trial, params = Trial(study, frozen._trial_id), frozen.params
                else:
                    trial = study.ask(dists)
                    params = trial.params
                run = trial_run(composer, spec, trial.number, params)
                trial.set_user_attr("run_id", run.id)
                trial.set_user_attr("label", run.label)
                if (read_status(run.run_dir) or {}).get("state") == "finished":
                    done += _tell(study, trial, run, s, echo)
                    continue
                prepare(run)
                inflight.append((trial, Tracked(run, submit_run(executor, worker, run))))
            ended_jobs = {id(t) for t in watch.ended_runs([tracked for _, tracked in inflight])}
            for trial, tracked in list(inflight):
                if s.pruner.get("name") != "none" and _prune(trial, tracked, s, id(tracked) in ended_jobs):
                    inflight.remove((trial, tracked))
                    study.tell(trial, state=TrialState.PRUNED)
                    echo(f"trial {trial.number} pruned  {tracked.run.label}")
                    done += 1
                elif id(tracked) in ended_jobs:
                    inflight.remove((trial, tracked))
                    state = reconcile(tracked)
                    if state == "watch":  # a worker of an earlier launch holds the run: follow it
                        inflight.append((trial, Tracked(tracked.run)))
                        continue
                    if state == "resume":  # ... and it died while we watched
                        prepare(tracked.run)
                        inflight.append((trial, Tracked(tracked.run, submit_run(executor, worker, tracked.run))))
                        continue
                    done += _tell(study, trial, tracked.run, s, echo)
            time.sleep(POLL_S if inflight else 0)
    except KeyboardInterrupt:  # as a grid's launch: stopped, the runs interrupted, the trials left RUNNING
        _stop(spec, [tracked for _, tracked in inflight], echo)
        raise
    states = [t.state.name.lower() for t in study.get_trials(deepcopy=False)]
    return {k: states.count(k) for k in sorted(set(states))}


def _stop(spec: SweepSpec, tracked: list[Tracked], echo: Callable[[str], None]) -> None:
    """Ctrl-C: the trials' jobs stopped through the sweep's launcher, in its one line (local ones:
    SIGTERM, their workers record the runs interrupted; a worker killed after the wait is recorded so
    here); Slurm's keep running. Their trials stay RUNNING in the study: the next `sweep run` relaunches
    exactly those runs, which resume from their checkpoints (or, still running, are watched)."""
    spec.launcher.stop([t.job for t in tracked if t.job is not None], echo)
    record_stopped(tracked)


def _tell(study, trial, run: RunSpec, s: SearchSpec, echo) -> int:
    from optuna.trial import TrialState  # deferred: optuna, as in storage_for

    status = read_status(run.run_dir) or {}
    value = objective_value(run.run_dir, s.metric) if status.get("state") == "finished" else None
    if value is None:
        study.tell(trial, state=TrialState.FAIL)
        why = status.get("error") or f"no value for {s.metric}"
        echo(f"trial {trial.number} failed  {run.label}: {why}")
    else:
        study.tell(trial, value)
        echo(f"trial {trial.number} {s.metric}={value:.4g}  {run.label}")
    return 1


def _prune(trial, tracked: Tracked, s: SearchSpec, ended: bool) -> bool:
    """Report the trial's new intermediate values; stop its job when Optuna prunes it (`ended`:
    the launch's watch saw its job end this round)."""
    values = intermediate_values(tracked.run.run_dir, s.metric)
    reported = trial.user_attrs.get("_reported_steps", [])
    new = sorted(k for k in values if k not in reported)
    for step in new:
        trial.report(values[step], step)
    if new:
        trial.set_user_attr("_reported_steps", reported + new)
    if not new or not trial.should_prune() or tracked.job is None or ended:
        return False
    stop_job(tracked.job)
    deadline = time.time() + 30
    while not tracked.job.done() and time.time() < deadline:
        time.sleep(0.2)
    update_status(tracked.run.run_dir, state="interrupted", error=f"pruned by Optuna at step {new[-1]}")
    return True


def best_trial(spec: SweepSpec) -> dict[str, Any] | None:
    """The best completed trial (number, value, params, run id), or None."""
    try:
        study = load_study(spec)
    except KeyError:
        return None
    try:
        t = study.best_trial
    except ValueError:
        return None
    return {
        "number": t.number,
        "value": t.value,
        "params": t.params,
        "run_id": t.user_attrs.get("run_id"),
        "label": t.user_attrs.get("label"),
        "n_trials": len(study.trials),
    }
