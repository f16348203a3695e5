"""A refusal never imports torch (docs/design.md, "Fast refusals"): the rule modules, whose `Params`
the config checks build, import torch inside the functions that compute, so a refused value exits
before torch's ~1.2 s import; a valid command goes on to train with it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run_py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "trainer.max_steps=-3"], "trainer.max_steps: must be ≥ 0, got -3"),
        (["train", "method=stare", "method.params.P=1.5"], "rule 'stare': P=1.5 is out of range (0 < P ≤ 1)"),
        (["train", "trainer.max_stepz=3"], "unknown config key 'trainer.max_stepz'"),
        (["train", "method=nosuchrule"], "nosuchrule"),
    ],
)
def test_a_refused_value_exits_before_torch_is_imported(argv, message):
    run = run_py(f"""
        import sys
        from stare_lab.cli import main
        code = main({argv!r})
        heavy = sorted(m for m in ("trl", "transformers") if m in sys.modules)
        print("torch loaded:", "torch" in sys.modules, "heavy:", heavy)
        sys.exit(code)
    """)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "torch loaded: False heavy: []" in run.stdout, run.stdout


def test_view_refusals_exit_before_torch_is_imported(tmp_path):
    """`view` of a run that kept no batch, and of a step a run did not keep, are refused from file names
    and the run's config: one line, exit 2, no torch (stare_lab.cli.reading._view_refusal)."""
    never = tmp_path / "never"
    never.mkdir()
    (never / "config.yaml").write_text("trainer: {keep_batches_every: 0}\n")
    kept = tmp_path / "kept"
    (kept / "batches").mkdir(parents=True)
    (kept / "config.yaml").write_text("trainer: {keep_batches_every: 2}\n")
    (kept / "batches" / "step-2.safetensors").write_bytes(b"")
    cases = [
        (
            [str(never)],
            f"run {never} has no kept batches (batches/step-<N>.safetensors): trainer.keep_batches_every is 0",
        ),
        ([str(kept), "--step", "5"], f"step 5 was not kept in run {kept}; kept steps: 2"),
        ([str(tmp_path / "nothing")], "is neither a run directory nor a sweep YAML"),
    ]
    for argv, message in cases:
        run = run_py(f"""
            import sys
            from stare_lab.cli import main
            code = main(["view", *{argv!r}])
            print("torch loaded:", "torch" in sys.modules)
            sys.exit(code)
        """)
        assert run.returncode == 2, run.stderr
        assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert "torch loaded: False" in run.stdout, run.stdout


def test_no_rule_module_imports_torch_at_its_top():
    """Every rule of the registry, its Params built and checked, and the sweep's dry run: no torch.
    A rule file that imports torch at its top (a mutation of any of them) fails this test."""
    run = run_py("""
        import sys
        from stare_lab.methods import get_method, list_methods, method_params
        names = list_methods()
        for name in names:
            get_method(name)
        modules = sorted({method_params(n).__module__ for n in names})
        print(len(names), "rules,", len(modules), "modules; torch:", "torch" in sys.modules)
    """)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "21 rules, 21 modules; torch: False", run.stdout


def test_a_valid_train_command_trains_with_the_real_torch(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "stare_lab.cli",
            "train",
            "model=builtin",
            "logger=none",
            "trainer.max_steps=1",
            "eval.enabled=false",
            f"run_dir={tmp_path / 'r'}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "r" / "metrics.jsonl").read_text().count("\n") == 1


# A bad flag of each command that parses with argparse: a choice, a type, an unknown flag, a missing
# argument. argparse alone prints its usage block before its error; every refusal is one line.
BAD_FLAGS = [
    (["table", "X.yaml", "--format", "xml"], "stare-lab table: argument --format: invalid choice: 'xml'"),
    (["table", "X.yaml", "--confidence", "high"], "stare-lab table: argument --confidence: invalid float value"),
    (["plot", "X.yaml", "--bogus"], "stare-lab plot: unrecognized arguments: --bogus"),
    (["plot"], "stare-lab plot: the following arguments are required: sweep"),
    (["eval", "runs/x", "--n", "many"], "stare-lab eval: argument --n: invalid int value: 'many'"),
    (["eval", "runs/x", "--engine", "gpt"], "stare-lab eval: argument --engine: invalid choice: 'gpt'"),
    (["view", "runs/x", "--step", "last"], "stare-lab view: argument --step: invalid int value: 'last'"),
    (["view", "runs/x", "--bogus"], "stare-lab view: unrecognized arguments: --bogus"),
    (["sweep", "run", "X.yaml", "--launcher", "k8s"], "stare-lab sweep run: argument --launcher: invalid choice"),
    (["sweep", "run", "X.yaml", "--workers", "two"], "stare-lab sweep run: argument --workers: invalid int value"),
    (["sweep", "stop", "X.yaml"], "stare-lab sweep: argument command: invalid choice: 'stop'"),
    (["sweep", "status"], "stare-lab sweep status: the following arguments are required: file"),
    (["demo", "--fast"], "stare-lab demo: unrecognized arguments: --fast"),
    (["dashboard", "X.yaml", "--bogus"], "stare-lab dashboard: unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_a_bad_flag_is_one_line_exit_2_before_torch(argv, message):
    run = run_py(f"""
        import sys
        from stare_lab.cli import main
        code = main({argv!r})
        print("torch loaded:", "torch" in sys.modules)
        sys.exit(code)
    """)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith(f"stare-lab: error: {message}"), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stdout == "torch loaded: False\n", run.stdout


def test_help_still_prints_the_usage_and_exits_0():
    for argv in (["table", "--help"], ["sweep", "run", "--help"], ["view", "--help"]):
        cmd = [sys.executable, "-m", "stare_lab.cli", *argv]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout.startswith(f"usage: stare-lab {' '.join(argv[:-1])}"), run
