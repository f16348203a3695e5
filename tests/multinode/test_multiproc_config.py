"""Multi-process settings before anything starts: bad input is one line and launches nothing;
the world size and engine enter the run id only for several processes; `--dry-run` prints
processes per run and GPUs; the engine's TrainingArguments; checkpoints of another world size."""

from __future__ import annotations

import pytest
from sweep_fixtures import slurm_cluster, write_sweep  # noqa: F401

from stare_lab.cli.sweep import main
from stare_lab.config.run_config import ConfigError, compose, run_id

TWO = {"trainer.per_device_train_batch_size": 6, "trainer.num_generations": 4, "trainer.gradient_accumulation_steps": 1}


def _refused(capsys, path, *extra) -> str:
    assert main(["sweep", "run", str(path), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stare-lab: error: ") and "\n" not in err and "Traceback" not in err, err
    assert not (path.parent / "runs").exists()  # nothing launched, nothing written
    return err


@pytest.mark.parametrize(
    "launcher, key",
    [
        ({"name": "local", "processes": 0}, "launcher.processes"),
        ({"name": "local", "processes": -2}, "launcher.processes"),
        ({"name": "slurm", "nodes": 0}, "launcher.nodes"),
        ({"name": "slurm", "tasks_per_node": 0}, "launcher.tasks_per_node"),
    ],
)
def test_processes_or_nodes_below_one_is_one_line(tmp_path, capsys, launcher, key):
    err = _refused(capsys, write_sweep(tmp_path, overrides=TWO, launcher=launcher))
    assert f"{key}: must be ≥ 1" in err


def test_tasks_per_node_other_than_one_per_gpu_is_refused(tmp_path, capsys):
    err = _refused(capsys, write_sweep(tmp_path, launcher={"name": "slurm", "gpus_per_node": 4, "tasks_per_node": 2}))
    assert "launcher.tasks_per_node" in err and "one process per GPU" in err


def test_a_batch_that_can_not_be_split_over_the_processes_is_one_line(tmp_path, capsys):
    # 3 rows × 1 micro-batch × 2 processes = 6 rollouts: not whole groups of 4
    path = write_sweep(
        tmp_path,
        overrides={**TWO, "trainer.per_device_train_batch_size": 3},
        launcher={"name": "local", "processes": 2},
    )
    err = _refused(capsys, path)
    assert "trainer.num_generations" in err and "× processes" in err and "3 × 1 × 2 = 6" in err


def test_a_batch_split_over_processes_needs_whole_groups_only_globally(tmp_path, capsys):
    # 6 rows per rank with G = 4 (a group spans both ranks): fine with 2 processes, not with 1
    ok = write_sweep(tmp_path, "two", overrides=TWO, launcher={"name": "local", "processes": 2})
    assert main(["sweep", "run", str(ok), "--dry-run"]) == 0
    assert "processes per run: 2" in capsys.readouterr().out
    one = write_sweep(tmp_path, "one", overrides=TWO)
    assert "is not divisible by num_generations" in _refused(capsys, one)


@pytest.mark.parametrize("engine", ["deepspeed_zero2", "deepspeed_zero3"])
def test_deepspeed_not_installed_is_one_line(tmp_path, capsys, engine):
    pytest.importorskip("torch")
    import importlib.util

    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("DeepSpeed is installed here")
    path = write_sweep(
        tmp_path,
        overrides={**TWO, "trainer.distributed": engine, "trainer.use_cpu": False},
        launcher={"name": "local", "processes": 2},
    )
    err = _refused(capsys, path)
    assert f"trainer.distributed: {engine} needs DeepSpeed" in err and "stare-lab[deepspeed]" in err


def test_fsdp_without_torch_distributed_is_one_line(tmp_path, capsys, monkeypatch):
    import torch.distributed

    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    path = write_sweep(
        tmp_path,
        overrides={**TWO, "trainer.distributed": "fsdp", "trainer.use_cpu": False},
        launcher={"name": "local", "processes": 2},
    )
    assert "trainer.distributed: fsdp needs a torch build with torch.distributed" in _refused(capsys, path)


def test_fsdp_on_cpu_processes_is_refused_not_silently_ddp(tmp_path, capsys):
    path = write_sweep(
        tmp_path, overrides={**TWO, "trainer.distributed": "fsdp"}, launcher={"name": "local", "processes": 2}
    )
    assert "trainer.distributed: fsdp shards over GPUs only" in _refused(capsys, path)
    one = write_sweep(tmp_path, "one", overrides={"trainer.distributed": "fsdp"})  # one process: the key is ignored
    assert main(["sweep", "run", str(one), "--dry-run"]) == 0


def test_unknown_engine_is_one_line(tmp_path, capsys):
    path = write_sweep(tmp_path, overrides={**TWO, "trainer.distributed": "megatron"})
    assert "'megatron' is not one of ddp, fsdp, deepspeed_zero2, deepspeed_zero3" in _refused(capsys, path)


def test_world_size_and_engine_enter_the_run_id_only_with_several_processes():
    base = compose([])
    assert run_id(compose(["trainer.distributed=fsdp"])) == base.run.id == run_id(compose(["trainer.ddp_timeout_s=99"]))
    two = compose(["run.processes=2", "trainer.per_device_train_batch_size=16"])
    assert two.run.id != run_id(compose(["trainer.per_device_train_batch_size=16"]))
    gpu = ["trainer.use_cpu=false", "trainer.per_device_train_batch_size=16"]
    assert (
        run_id(compose(["run.processes=2", *gpu, "trainer.distributed=fsdp"]))
        != compose(["run.processes=2", *gpu]).run.id
    )
    with pytest.raises(ConfigError, match="run.processes: must be ≥ 1"):
        compose(["run.processes=0"])


def test_dry_run_prints_processes_per_run_and_the_gpus_of_the_sweep(capsys):
    assert main(["sweep", "run", "stare", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "processes per run: 8 (1 node(s) × 8)" in out
    # 12 arms and 6 control runs (base and random_reward × 3 seeds), 8 GPUs each
    assert "GPUs: 8 per run, 144 for the sweep (96 at once, 12 runs in parallel)" in out
    assert main(["sweep", "run", "token_ablation", "--dry-run"]) == 0
    assert "processes per run: 4" in capsys.readouterr().out


def test_dry_run_of_a_two_node_run(tmp_path, capsys):
    path = write_sweep(
        tmp_path,
        overrides={
            "trainer.per_device_train_batch_size": 4,
            "trainer.num_generations": 8,
            "trainer.gradient_accumulation_steps": 2,
        },
        seeds=[0, 1, 2],
        launcher={"name": "slurm", "nodes": 2, "gpus_per_node": 8, "array_parallelism": 2},
    )
    assert main(["sweep", "run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "processes per run: 16 (2 node(s) × 8); GPUs: 16 per run, 48 for the sweep (32 at once, 2 runs in parallel)"
        in out
    )


@pytest.mark.slurm
def test_slurm_executor_asks_for_one_task_per_gpu_and_kill_on_bad_exit(slurm_cluster, tmp_path):
    # submitit's SlurmExecutor looks for `srun` when it is built: without a cluster this skips (slurm_cluster)
    from stare_lab.plan.schema import load_sweep
    from stare_lab.sweep.launch import make_executor

    spec = load_sweep(write_sweep(tmp_path, launcher={"name": "slurm", "nodes": 2, "gpus_per_node": 8}))
    p = make_executor(spec).parameters
    assert (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"]) == (2, 8, 8)
    assert p["srun_args"] == ["--kill-on-bad-exit=1"]
    one = load_sweep(write_sweep(tmp_path, "one", launcher={"name": "slurm"}))
    p = make_executor(one).parameters
    assert (p["nodes"], p["ntasks_per_node"]) == (1, 1) and "srun_args" not in p  # one process: as before


def test_local_executor_starts_one_task_per_process(tmp_path):
    from stare_lab.plan.schema import load_sweep
    from stare_lab.sweep.launch import make_executor

    local = load_sweep(write_sweep(tmp_path, "loc", overrides=TWO, launcher={"name": "local", "processes": 2}))
    assert make_executor(local).parameters["tasks_per_node"] == 2


def test_engine_arguments(monkeypatch):
    from stare_lab.run.runner import engine_args

    monkeypatch.setenv("WORLD_SIZE", "1")
    assert engine_args("fsdp") == {} == engine_args("deepspeed_zero3")  # one process: as before
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert engine_args("ddp") == {}
    fsdp = engine_args("fsdp")
    assert fsdp["fsdp"] is True and fsdp["fsdp_config"]["version"] == 2
    zero3 = engine_args("deepspeed_zero3")["deepspeed"]["zero_optimization"]
    assert zero3["stage"] == 3 and zero3["stage3_gather_16bit_weights_on_model_save"]
    assert engine_args("deepspeed_zero2")["deepspeed"]["zero_optimization"]["stage"] == 2


def test_a_checkpoint_of_another_world_size_is_refused_in_one_line(tmp_path, monkeypatch):
    import stare_lab.run.runner as runner
    from stare_lab.record import checkpoint_world_size

    ckpt = tmp_path / "checkpoints" / "checkpoint-4"
    ckpt.mkdir(parents=True)
    (ckpt / "rng_state_0.pth").write_bytes(b"")
    (ckpt / "rng_state_1.pth").write_bytes(b"")
    assert checkpoint_world_size(ckpt) == 2
    monkeypatch.setattr(runner, "last_checkpoint", lambda run_dir, problems=None: ckpt)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError) as e:
        runner.resume_point(tmp_path)
    assert str(e.value).startswith("checkpoint-4 was written by 2 process(es) and this run has 1") and "\n" not in str(
        e.value
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert runner.resume_point(tmp_path) == ckpt  # rank 1: same checkpoint, no repairs


def test_command_line_processes_and_nodes_override_the_file(tmp_path, capsys):
    path = write_sweep(tmp_path, overrides=TWO, launcher={"name": "local"})
    assert main(["sweep", "run", str(path), "--dry-run", "--processes", "2"]) == 0
    assert "processes per run: 2 (2 on this machine)" in capsys.readouterr().out
    assert main(["sweep", "run", str(path), "--dry-run", "--launcher", "slurm", "--nodes", "2", "--gpus", "4"]) == 0
    assert "processes per run: 8 (2 node(s) × 4)" in capsys.readouterr().out
    assert "launcher.processes: must be ≥ 1" in _refused(capsys, path, "--processes", "0")
