"""`stare-lab claims` end to end: simulated records written as runs write them (resolved configs, status,
metrics.jsonl, per-sample parquet; tests/support/claims_fixtures.py), the report and its files, a
verdict that one edited record flips, and bad claims refused in one line (exit 2, no torch) by
`stare-lab claims` and by `stare-lab sweep run --dry-run`."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import yaml
from claims_fixtures import simulate_problems, simulate_training, sweep_file, write_records

from stare_lab.analysis.verdicts import decide, sweep_frames
from stare_lab.cli.claims import load_claims

SEEDS = [0, 1, 2]
ARMS = {a: {"method": a} for a in ("full", "stare", "top_entropy", "low_entropy")}
SRC = {"arxiv": "2606.19236", "where": "Table 2", "number": "58.5 → 62.0 (O1)", "model": "Qwen3-8B-Base"}
SCORE = {"score": "avg@32", "benchmarks": ["arithmetic"]}
CLAIMS = [
    {"id": "stare_beats_full", "source": SRC, "form": "superiority", "a": "stare", "b": "full", "quantity": SCORE},
    {"id": "low80_hurts", "source": "own", "form": "inferiority", "a": "low_entropy", "b": "full", "quantity": SCORE},
    {"id": "top20_matches", "source": "own", "form": "non_inferiority", "a": "top_entropy", "b": "full",
     "margin": "3 points", "quantity": SCORE},
    {"id": "rr_below_half", "source": "own", "form": "gain_below", "a": "random_reward", "b": "full", "base": "base",
     "fraction": 0.5, "quantity": SCORE},
    {"id": "stare_entropy", "source": "own", "form": "superiority", "a": "stare", "b": "full",
     "quantity": {"metric": "entropy", "at": "last"}},
    {"id": "narrowing", "source": "own", "form": "superiority", "a": "base", "b": "full",
     "quantity": {"score": "pass@32"}},
]  # fmt: skip
EFFECTS = {"full": 10.0, "stare": 25.0, "top_entropy": 10.0, "low_entropy": -10.0, "base": 0.0, "random_reward": 1.0}
ENTROPY = {"full": (0.3, 0.02), "stare": (0.6, 0.02), "top_entropy": (0.3, 0.02), "low_entropy": (0.2, 0.02),
           "random_reward": (0.3, 0.02)}  # fmt: skip


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import sys
        from stare_lab.cli import main
        code = main({list(args)!r})
        print("torch loaded:", "torch" in sys.modules)
        sys.exit(code)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture
def sweep(tmp_path):
    rng = np.random.default_rng(2)
    path = sweep_file(tmp_path, "cl", ARMS, SEEDS, CLAIMS, controls=["base", "random_reward"])
    problems = simulate_problems(EFFECTS, rng, seeds=SEEDS, problems=80, seed_sd=0.01)
    write_records(path, problems, simulate_training(ENTROPY, rng, seeds=SEEDS))
    return path


def test_the_report_decides_each_claim_from_the_records(sweep, tmp_path):
    out = tmp_path / "report"
    run = cli("claims", str(sweep), "--out", str(out))
    assert run.returncode == 0, run.stderr
    text = run.stdout
    assert text.startswith("Claims of sweep cl: 6 claims from 18 finished runs")
    assert "| stare_beats_full | 2606.19236 Table 2 | 58.5 → 62.0 (O1) (Qwen3-8B-Base) | stare > full; " in text
    assert "Holm's step-down correction over the 6 claims" in text
    assert "not whether a paper's claim holds for the paper's models" in text
    assert sorted(p.name for p in out.iterdir()) == ["claims.csv", "claims.md", "claims.png", "claims.tex"]
    assert (out / "claims.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "\\begin{tabular}" in (out / "claims.tex").read_text()
    csv = pd.read_csv(out / "claims.csv").set_index("id")
    # the numbers are the statistics' on the records' frames, nothing else
    spec, claims = load_claims(str(sweep))
    problems, training, _ = sweep_frames(spec.folder, claims)
    frame = decide(claims, problems, training).set_index("id")
    for column in ("estimate", "lo", "hi", "p_support", "p_contra", "p_support_holm"):
        np.testing.assert_allclose(csv[column], frame[column], rtol=1e-9, equal_nan=True)
    assert csv.loc["stare_beats_full", "verdict"] == "supported"
    assert csv.loc["low80_hurts", "verdict"] == "supported"
    assert csv.loc["stare_entropy", "verdict"] == "supported"
    assert csv.loc["rr_below_half", "verdict"] == "supported"
    assert csv.loc["stare_beats_full", "paper_arxiv"] == 2606.19236
    assert 10 < csv.loc["stare_beats_full", "estimate"] < 20  # stare's true +15 points over full, and its noise


def _entropy_of_one_run(folder, arm: str, seed: int, value: float) -> None:
    for run_dir in folder.iterdir():
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else None
        if cfg and cfg["method"]["name"] == arm and cfg["seed"] == seed:
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            rows[-1]["entropy"] = value
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            return
    raise AssertionError(f"no run of {arm} seed {seed}")


def _all_wrong(folder, arm: str, seed: int) -> None:
    """Every sample of one run's evaluation judged wrong (its per-sample parquet rewritten)."""
    for run_dir in folder.iterdir():
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else None
        if cfg and cfg["method"]["name"] == arm and cfg["seed"] == seed:
            (parquet,) = (run_dir / "eval").rglob("*.parquet")
            table = pd.read_parquet(parquet)
            table.assign(correct=False).to_parquet(parquet)
            return
    raise AssertionError(f"no run of {arm} seed {seed}")


def _verdicts(sweep) -> dict[str, str]:
    run = cli("claims", str(sweep), "--format", "csv")
    assert run.returncode == 0, run.stderr
    csv_text = run.stdout.split("torch loaded:")[0]
    return dict(pd.read_csv(io.StringIO(csv_text))[["id", "verdict"]].itertuples(index=False, name=None))


def test_editing_one_record_flips_a_verdict(sweep):
    before = _verdicts(sweep)
    assert before["stare_entropy"] == before["stare_beats_full"] == "supported"
    folder = sweep.parent / "runs" / "cl"
    _entropy_of_one_run(folder, "stare", 0, -5.0)  # one seed's last entropy far below full's
    _all_wrong(folder, "stare", 1)  # one seed of stare solves nothing
    after = _verdicts(sweep)
    assert after["stare_entropy"] == "undecided" and after["stare_beats_full"] == "undecided"
    assert {k: v for k, v in after.items() if k not in ("stare_entropy", "stare_beats_full")} == {
        k: v for k, v in before.items() if k not in ("stare_entropy", "stare_beats_full")
    }


def _bad(tmp_path, name: str, change: dict, controls: bool = True):
    claims = [{**CLAIMS[0], **change}]
    claims[0] = {k: v for k, v in claims[0].items() if v is not None}
    extra = {"controls": ["base", "random_reward"]} if controls else {}
    return sweep_file(tmp_path, name, ARMS, SEEDS, claims, **extra)


REFUSED = [
    ("unknown arm", {"a": "stare2"}, "claims[0].a (stare_beats_full): arm 'stare2' is not in the sweep"),
    ("margin without a unit", {"form": "non_inferiority", "margin": 2},
     "claims[0].margin: 2: a margin carries its unit"),
    ("margin in the wrong unit", {"form": "non_inferiority", "margin": "2 nats"}, "avg@32 on arithmetic is in points"),
    ("a gain form without base", {"form": "retained_gain", "fraction": 0.5},
     "form retained_gain (A − base ≥ f·(B − base)) needs base"),
    ("a metric no run logs", {"quantity": {"metric": "entropyy", "at": "last"}},
     "'entropyy' is not logged by the runs"),
    ("avg@n the runs do not draw", {"quantity": {"score": "avg@8"}}, "avg@8: arm 'stare' draws n = 32 samples"),
    ("geometry without grad_geometry_every", {"quantity": {"metric": "geometry/cosine", "at": "last"}},
     "does not log geometry/cosine: set trainer.grad_geometry_every > 0"),
    ("base named without the control", {"b": "base"}, "arm 'base' is not in the sweep (declare it: controls: [base])"),
]  # fmt: skip


@pytest.mark.parametrize("case, change, message", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_bad_claim_is_refused_by_claims_and_by_the_dry_run(tmp_path, case, change, message):
    for command, controls in ((["claims"], True), (["sweep", "run", "--dry-run"], False)):
        if case == "base named without the control" and controls:
            continue  # declared: the claim is good
        path = _bad(tmp_path, f"bad{len(command)}", change, controls=controls)
        argv = [*command[:2], str(path), *command[2:]] if len(command) > 1 else [*command, str(path)]
        run = cli(*argv)
        err = run.stderr.strip()
        assert run.returncode == 2, (command, run.stdout[-1500:], err)
        assert len(err.splitlines()) == 1 and err.startswith("stare-lab: error: "), err
        assert message in err, (command, err)
        assert "torch loaded: False" in run.stdout
        assert not (tmp_path / "runs" / f"bad{len(command)}").exists()  # nothing launched


def test_a_metric_the_records_lack_is_refused_from_the_records(sweep):
    """rule/* metrics can only be known once a rule ran: checked against the records, one line."""
    data = yaml.safe_load(sweep.read_text())
    data["claims"].append({**CLAIMS[4], "id": "gate", "quantity": {"metric": "rule/gate", "at": "last"}})
    sweep.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    run = cli("claims", str(sweep))
    assert run.returncode == 2
    assert "claim gate: the runs of arm 'stare' did not log 'rule/gate' (they logged entropy, ...)" in run.stderr


def test_a_claims_file_of_its_own_names_its_sweep(sweep):
    own = sweep.parent / "more_claims.yaml"
    own.write_text(yaml.safe_dump({"sweep": sweep.name, "claims": [CLAIMS[0]]}, allow_unicode=True))
    run = cli("claims", str(own))
    assert run.returncode == 0, run.stderr
    assert "Claims of sweep cl: 1 claims from 18 finished runs: 1 supported." in run.stdout


def test_the_packaged_claims_sweep_checks_against_its_plan():
    """Every claim of stare_lab/sweeps/claims.yaml names an arm of its plan or a declared control, a
    metric its arms log (the gradient cosine where grad_geometry_every is set), and a source."""
    from stare_lab.cli.claims import _plan
    from stare_lab.methods.outside import reading
    from stare_lab.plan.claims import check_claims

    with reading():
        spec, claims = load_claims("claims")
        check_claims(claims, list(_plan(spec).values()), spec.controls, spec.where())
    assert spec.controls == ["base", "random_reward"]
    assert {c.id for c in claims} >= {
        "top20_not_worse", "low80_hurts", "random20_keeps_half", "explorer_unstable", "anchor_gradient_aligned",
        "stare_beats_full", "rsi_band_beats_full", "ict_beats_full_pass4", "gmts_beats_top_entropy",
        "opefo_keeps_entropy", "clip_cov_keeps_entropy", "kl_cov_keeps_entropy", "rl_narrows_pass_at_k",
        "random_reward_below_half",
    }  # fmt: skip
    assert all(c.source.get("arxiv") and c.source.get("number") and c.source.get("model") for c in claims)
