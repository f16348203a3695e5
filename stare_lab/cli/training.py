"""`stare-lab train` and `stare-lab eval`: one run trained from Hydra overrides, a run's checkpoint
evaluated again. Both check every value before anything heavy is imported: the trainer and the
sampler (torch, transformers, TRL, submitit) are imported inside the functions, after the checks,
so that a refusal never pays for them (docs/design.md, "Fast refusals")."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import open_dict

from stare_lab.cli.common import OneLineParser, UserError, parse
from stare_lab.config.inputs import check_inputs, overlap_warnings
from stare_lab.config.run_config import compose, load_config, save_config
from stare_lab.config.schema import missing_vllm
from stare_lab.methods.outside import import_modules, import_run_modules, run_entries
from stare_lab.record import CONFIG_FILE, read_eval_results, read_metrics

# The last training row's keys `train` prints (then every rule/ key of that row).
LAST_METRICS = (
    "step",
    "reward",
    "accuracy",
    "entropy",
    "tokens/trained_frac",
    "tokens/touched_frac",
    "tokens/weight_mean",
)


def cmd_train(argv: list[str]) -> int:
    """One run from Hydra overrides; its record goes to <run.root>/<run.sweep>/<run-id>/ (or run_dir=...).
    `--import MODULE` (repeatable): a module of rules kept outside the package, imported first."""
    overrides, modules, run_dir = _train_arguments(argv)
    imported = import_modules(modules, Path.cwd(), "--import")  # before the rule's name is checked
    cfg = compose(overrides)
    if imported:  # the worker imports them too (stare_lab.methods.outside)
        with open_dict(cfg.run):
            cfg.run.imports = run_entries(imported)
    check_inputs(cfg)
    for line in overlap_warnings(cfg):
        print(f"stare-lab: {line}", file=sys.stderr)
    if cfg.run.label is None:
        cfg.run.label = " ".join(overrides) or "default"
    run_dir = run_dir or Path(cfg.run.root) / cfg.run.sweep / cfg.run.id
    config_path = run_dir / CONFIG_FILE
    if config_path.exists():
        old = load_config(config_path)
        if old.run.id != cfg.run.id:
            raise UserError(f"{run_dir} holds another run ({old.run.id}); refusing to overwrite it")
    else:
        save_config(cfg, config_path)
    print(f"run {cfg.run.id} ({cfg.method.name}, seed {cfg.seed}) → {run_dir}")
    return _train(run_dir)


def _train_arguments(argv: list[str]) -> tuple[list[str], list[str], Path | None]:
    """(Hydra overrides, --import modules, run_dir=... or None) of `train`'s arguments."""
    run_dir = None
    overrides, modules = [], []
    args = iter(argv)
    for a in args:
        if a.startswith("run_dir="):
            run_dir = Path(a.split("=", 1)[1])
        elif a == "--import" or a.startswith("--import="):
            module = a.split("=", 1)[1] if "=" in a else next(args, None)
            if not module:
                raise UserError("--import: expected a module name (--import my_rules)")
            modules.append(module)
        elif a.startswith("-"):
            raise UserError(
                f"unknown option {a!r}; train takes --import MODULE and Hydra overrides like method=stare seed=1"
            )
        else:
            overrides.append(a)
    return overrides, modules, run_dir


def _train(run_dir: Path) -> int:
    """Train the run whose config is in `run_dir` in this process; 0 when it finished."""
    from stare_lab.sweep.worker import run_one, start_worker  # deferred: submitit, and the trainer's torch

    start_worker()
    try:
        status = run_one(run_dir)
    except Exception as e:  # the run's own failure: recorded in status.json with its traceback
        print(
            f"stare-lab: run failed: {str(e).splitlines()[0] if str(e) else type(e).__name__} "
            f"(traceback in {run_dir / 'status.json'})",
            file=sys.stderr,
        )
        return 1
    if status.get("claimed_elsewhere"):
        print(
            f"stare-lab: {run_dir} is being run by another worker (pid {status.get('pid')} on "
            f"{status.get('host')}); nothing done",
            file=sys.stderr,
        )
        return 1
    _print_last_metrics(run_dir)
    return 0 if status.get("state") == "finished" else 1


def _print_last_metrics(run_dir: Path) -> None:
    rows = read_metrics(run_dir)
    if rows:
        last = rows[-1]
        keys = [*LAST_METRICS, *sorted(k for k in last if k.startswith("rule/"))]
        print("  ".join(f"{k}={last[k]:.4g}" if isinstance(last.get(k), float) else f"{k}={last.get(k)}" for k in keys))
    for result in read_eval_results(run_dir):
        if result["final"]:
            print_result(result)


def print_result(result: dict[str, Any]) -> None:
    """`arithmetic: avg@4=0.250  pass@1=...  (n=4, T=1, top-p=0.7, max tokens 8, exact, step 2)`."""
    m = result.get("metrics") or {}
    settings = (
        f"n={result.get('n')}, T={result.get('temperature')}, top-p={result.get('top_p')}, "
        f"max tokens {result.get('max_tokens')}, {result.get('verifier')}, step {result.get('step')}"
    )
    print(
        f"{result['benchmark']}: "
        + "  ".join(f"{k}={v:.3f}" for k, v in m.items() if isinstance(v, float))
        + f"  ({settings})"
    )


def cmd_eval(argv: list[str]) -> int:
    """A run's final checkpoint evaluated (again) under the given settings; results into its record."""
    a = parse(_eval_parser(), argv)
    if not (a.run_dir / CONFIG_FILE).is_file():
        raise UserError(f"{a.run_dir} is not a run directory (no {CONFIG_FILE})")
    import_modules(a.imports, Path.cwd(), "--import")
    overrides = {"n": a.n, "temperature": a.temperature, "top_p": a.top_p, "max_tokens": a.max_tokens}
    overrides = {k: v for k, v in {**overrides, "engine": a.engine}.items() if v is not None}
    _check_eval_settings(overrides)
    cfg = load_config(a.run_dir / CONFIG_FILE)
    import_run_modules(cfg.run, f"{a.run_dir / CONFIG_FILE}: run.imports")
    if (a.engine or cfg.eval.get("engine")) == "vllm" and missing_vllm():
        raise UserError(f"{'--engine' if a.engine else 'eval.engine:'} vllm: {missing_vllm()}")
    if a.benchmarks:
        cfg.eval.benchmarks = a.benchmarks
    from stare_lab.evaluation.run_eval import evaluate_run  # deferred: torch and transformers (the sampler), submitit
    from stare_lab.sweep.worker import start_worker
    from stare_lab.viewer.wandb_export import log_eval

    start_worker()
    for result in evaluate_run(a.run_dir, cfg, force=a.force, overrides=overrides).values():
        print_result(result)
    log_eval(a.run_dir)  # into the run's W&B record (nothing when W&B is off)
    return 0


def _eval_parser() -> OneLineParser:
    p = OneLineParser(prog="stare-lab eval")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--n", type=int, default=None, help="samples per problem (default: the benchmark's own)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--benchmarks", nargs="*", default=None)
    p.add_argument(
        "--engine", choices=["transformers", "vllm"], default=None, help="sampler (default: the run's eval.engine)"
    )
    p.add_argument("--force", action="store_true", help="re-evaluate even if a result under the same settings exists")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module of rules kept outside the package (besides the run's own run.imports); repeatable",
    )
    return p


def _check_eval_settings(s: dict[str, Any]) -> None:
    problems = {
        "n": s.get("n", 1) >= 1,
        "temperature": s.get("temperature", 0.0) >= 0,
        "top_p": 0 < s.get("top_p", 1.0) <= 1,
        "max_tokens": s.get("max_tokens", 1) >= 1,
    }
    bad = [k for k, ok in problems.items() if not ok]
    if bad:
        ranges = {"n": "≥ 1", "temperature": "≥ 0", "top_p": "in (0, 1]", "max_tokens": "≥ 1"}
        raise UserError(f"--{bad[0].replace('_', '-')} {s[bad[0]]}: expected a value {ranges[bad[0]]}")
