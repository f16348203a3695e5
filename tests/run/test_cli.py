"""Bad input on the command line: one clear line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import pytest

from stare_lab.cli import main


@pytest.mark.parametrize(
    "args, needle",
    [
        (["method=nope"], "unknown method option 'nope'; valid: adv_reweight, anchor, archer, attn_soft"),
        (["method=stare", "method.params.Q=1"], "unknown parameter 'Q' for rule 'stare'; valid parameters:"),
        (["method=top_entropy", "method.params.rho=1.5"], "rho=1.5 is out of range"),
        (["method=rsi_band", "method.params.low=3", "method.params.high=2"], "low"),
        (["trainer.max_stepz=3"], "unknown config key 'trainer.max_stepz'; valid keys under trainer:"),
        (["trainer.max_steps=abc"], "trainer.max_steps"),
        (["task=math"], "missing value for task.train_source"),
        (["model=gpt5"], "unknown model option 'gpt5'"),
    ],
)
def test_train_bad_input_is_one_line_exit_2_and_writes_nothing(args, needle, tmp_path, capsys):
    rc = main(["train", *args, f"run.root={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and err.startswith("stare-lab: error: ")
    assert needle in err
    assert "Traceback" not in err
    assert not any(tmp_path.iterdir()), "a rejected run must not create its run directory"


def test_unknown_command_and_missing_run_dir(tmp_path, capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    assert main(["table", str(tmp_path / "missing.yaml")]) == 2
    assert "no such sweep file or run folder" in capsys.readouterr().err


def test_train_refuses_to_overwrite_another_runs_record(tmp_path, capsys):
    """A run dir holding a different run's config is never overwritten."""
    from stare_lab.config.run_config import compose, save_config

    other = compose(["method=stare", "seed=5"])
    d = tmp_path / "taken"
    save_config(other, d / "config.yaml")
    before = (d / "config.yaml").read_text()
    assert main(["train", "method=full", f"run_dir={d}"]) == 2
    assert "holds another run" in capsys.readouterr().err
    assert (d / "config.yaml").read_text() == before


def test_train_writes_a_complete_run_record(tmp_path, capsys):
    """`stare-lab train method=stare seed=1 ...`: resolved config, status, metrics, checkpoint, eval."""
    import json

    from stare_lab.config.run_config import load_config

    args = [
        "method=stare",
        "seed=1",
        "trainer.max_steps=2",
        "trainer.save_steps=1",
        "trainer.num_generations=4",
        "trainer.per_device_train_batch_size=8",
        "trainer.gradient_accumulation_steps=1",
        "logger=none",
        "task.heldout_size=8",
        "eval.n=2",
        f"run.root={tmp_path}",
    ]
    assert main(["train", *args]) == 0
    (run_dir,) = list((tmp_path / "train").iterdir())
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.run.id == run_dir.name and cfg.method.name == "stare" and cfg.seed == 1
    assert cfg.method.params.W == 1.1 and cfg.method.params.variant == "O1"  # defaults filled in
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (run_dir / "checkpoints" / "checkpoint-2" / "rule_state.json").is_file()
    assert len(list((run_dir / "eval" / "arithmetic").glob("step-2_n2_*_exact.parquet"))) == 1
    out = capsys.readouterr().out
    assert "rule/gate=" in out and "arithmetic: avg@2=" in out
    # the same command again reuses the finished run
    assert main(["train", *args]) == 0
    assert json.loads((run_dir / "status.json").read_text())["attempts"] == 1
