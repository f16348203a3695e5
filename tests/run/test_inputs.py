"""Every file a run reads is checked before anything launches (stare_lab/config/inputs.py): one line, exit 2,
no run directory; a training set that holds held-out problems is said in one line."""

from __future__ import annotations

import json

import pytest

from stare_lab.cli import main
from stare_lab.config.inputs import check_inputs, input_problems, overlap_warnings
from stare_lab.config.run_config import ConfigError, compose


def _jsonl(path, problems):
    path.write_text("".join(json.dumps({"problem": p, "answer": "1"}) + "\n" for p in problems))
    return path


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["model.name_or_path=./no_such_model"], "model.name_or_path: ./no_such_model does not exist"),
        (["task=math", "task.train_source=./no_train.jsonl"], "task.train_source: ./no_train.jsonl does not exist"),
        (
            [
                "task=math",
                "task.train_source=TRAIN",
                "task.heldout_source=./no_heldout.jsonl",
                "eval.benchmarks=[math]",
            ],
            "task.heldout_source: ./no_heldout.jsonl does not exist",
        ),
        (
            ["task=math", "task.train_source=TRAIN", "eval.benchmarks=[math]"],
            "eval.benchmarks: 'math' is the task's own held-out split, and task.heldout_source is not set",
        ),
    ],
)
def test_a_missing_input_is_one_line_and_exit_2_before_any_run_dir(tmp_path, monkeypatch, capsys, overrides, line):
    monkeypatch.chdir(tmp_path)
    train = _jsonl(tmp_path / "train.jsonl", ["1+0"])
    argv = ["train", *(o.replace("TRAIN", str(train)) for o in overrides), f"run_dir={tmp_path / 'run'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stare-lab: error: {line}"]
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_a_hub_model_outside_the_cache_is_refused_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose(["model.name_or_path=someone/not-cached-1B"])
    with pytest.raises(ConfigError, match="not in the local hub cache and HF_HUB_OFFLINE is set"):
        check_inputs(cfg)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # online the hub answers for its names: not checked here
    assert input_problems(cfg) == []


def test_a_saved_local_model_and_existing_files_pass(tmp_path):
    from stare_lab.models.builtin import build_model, build_tokenizer

    build_model(build_tokenizer()).save_pretrained(tmp_path / "model")
    train = _jsonl(tmp_path / "train.jsonl", ["1+0", "1+1"])
    cfg = compose(
        [
            f"model.name_or_path={tmp_path / 'model'}",
            "task=math",
            f"task.train_source={train}",
            f"task.heldout_source={train}",
            "eval.benchmarks=[math,math500]",
        ]
    )
    assert input_problems(cfg) == []
    (tmp_path / "empty").mkdir()
    bad = compose(["model.name_or_path=" + str(tmp_path / "empty")])
    assert input_problems(bad) == [f"model.name_or_path: {tmp_path / 'empty'} has no config.json (not a saved model)"]


def test_overlap_between_training_and_held_out_problems_is_one_line(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", ["What is 1+1?", "What is  2+2?", "Solve x"])
    held = _jsonl(tmp_path / "held.jsonl", ["What is 2+2?", "New one", "Solve x", "Another"])
    cfg = compose(["task=math", f"task.train_source={train}", f"task.heldout_source={held}", "eval.benchmarks=[math]"])
    assert overlap_warnings(cfg) == [
        f"warning: 2 of 4 held-out problems of 'math' ({held}) are also in the training set ({train})"
    ]
    sliced = compose(
        [
            "task=math",
            f"task.train_source={train}",
            f"task.heldout_source={held}",
            "eval.benchmarks=[math]",
            "task.heldout_limit=2",
        ]
    )
    assert overlap_warnings(sliced)[0].startswith("warning: 1 of 2 held-out problems")
    apart = compose(["task=math", f"task.train_source={train}", f"task.heldout_source={train}", "eval.enabled=false"])
    assert overlap_warnings(apart) == []  # nothing is evaluated


def test_a_sweep_with_a_missing_input_stops_before_any_run_dir(tmp_path, capsys):
    import yaml

    from stare_lab.cli.sweep import main as sweep_main

    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "base": {"task": "math", "overrides": {"task.train_source": str(tmp_path / "gone.jsonl")}},
                "grid": {"method": ["full", "stare"]},
                "output": str(tmp_path / "runs"),
            }
        )
    )
    for argv in (["run", str(path), "--dry-run"], ["run", str(path)]):
        assert sweep_main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"stare-lab: error: task.train_source: {tmp_path / 'gone.jsonl'} does not exist (run 'full seed=0')"
        ]
    folder = tmp_path / "runs" / "s"
    assert not folder.exists() or [p.name for p in folder.iterdir()] == [".lock"]  # no run directory, no record
