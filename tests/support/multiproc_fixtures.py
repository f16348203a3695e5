"""Helpers of the multi-process tests (tests/multinode/test_multiproc_*.py): the real runner with a rank
killed or slowed at a given step, picklable by module name for submitit's workers."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import yaml

# A 2-process run of the built-in model: 6 rows per rank, G = 4, so group 1 spans both ranks.
TWO_PROCESS = {
    "trainer.max_steps": 3,
    "trainer.save_steps": 1,
    "trainer.per_device_train_batch_size": 6,
    "trainer.num_generations": 4,
    "trainer.gradient_accumulation_steps": 1,
    "trainer.max_completion_length": 8,
    "trainer.ddp_timeout_s": 60,
    "task.train_size": 64,
    "task.heldout_size": 8,
}
KILLED_MARK = "killed-rank.json"


def _callback(fn):
    from transformers import TrainerCallback

    class _At(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            fn(state.global_step)
            return control

    return _At()


def kill_rank_1_of_seed_0(run_dir: Path) -> None:
    """The real runner; in the run of seed 0, rank 1 SIGKILLs itself at step 2 of its first attempt
    (after checkpoint-1), writing the time first."""
    from stare_lab.run.runner import execute

    run_dir = Path(run_dir)
    seed = yaml.safe_load((run_dir / "config.yaml").read_text())["seed"]
    mark = run_dir / KILLED_MARK

    def maybe_kill(step: int) -> None:
        if seed == 0 and os.environ.get("RANK") == "1" and step == 2 and not mark.exists():
            mark.write_text(f'{{"time": {time.time()}, "pid": {os.getpid()}}}')
            os.kill(os.getpid(), signal.SIGKILL)

    execute(run_dir, callbacks=[_callback(maybe_kill)])


def slow_steps(run_dir: Path) -> None:
    """The real runner, each optimizer step 2 s longer (time to requeue a job mid-run)."""
    from stare_lab.run.runner import execute

    execute(run_dir, callbacks=[_callback(lambda step: time.sleep(2.0))])


if __name__ == "__main__":  # the sweep driver with `slow_steps` as the runner (tests/multinode/test_multiproc_slurm.py)
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for stare_lab
    import multiproc_fixtures  # pickled by module name: workers can not import this __main__
    from sweep_fixtures import use_runner

    from stare_lab.cli.sweep import main

    use_runner(multiproc_fixtures.slow_steps)
    sys.exit(main(sys.argv[1:]))
