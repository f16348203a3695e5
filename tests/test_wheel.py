"""The package stands alone (issue 8): a wheel installed in a fresh venv composes and trains from
an empty directory, writing only there, and finds its configs, sweeps, built-in model and the
benchmark copies inside itself.

Offline and fast: the wheel is built without build isolation (the dev venv's setuptools) from a
copy of the package, the fresh venv has no pip of its own (the dev venv's pip installs into it),
and it reaches the already-installed dependencies through a .pth line naming the dev venv's
site-packages (a path line: the editable install's own .pth there is not processed, so
`import stare_lab` can only find the wheel).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_BENCHMARKS = ROOT.parent / "shared" / "data" / "benchmarks"
BENCHMARKS = ("aime24", "aime25", "amc23", "math500")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, (
        f"{' '.join(map(str, cmd))} → {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, stare-lab script, env) of a fresh venv holding only the built wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT / "stare_lab", src / "stare_lab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", src)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(WANDB_MODE="disabled", HF_HUB_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        cwd=tmp,
        env=env,
    )
    wheel = next((tmp / "dist").glob("stare_lab-*.whl"))
    venv.create(tmp / "venv", with_pip=False)
    python = tmp / "venv" / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        cwd=tmp,
        env=env,
    )
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env).stdout.strip()
    )
    (site / "zz_dev_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, tmp / "venv" / "bin" / "stare-lab", env, site


def test_the_installed_package_holds_its_configs_sweeps_model_and_benchmarks(installed, tmp_path):
    python, _, env, site = installed
    probe = """
import json, hashlib, stare_lab
from stare_lab.config import run_config as config
from stare_lab.plan.schema import load_sweep
from stare_lab.evaluation import load_benchmark
spec = load_sweep("demo")
data = {
    "package": stare_lab.__file__, "conf": str(config.CONF_DIR), "sweep": str(spec.path),
    "runs": len(spec.grid["method"]) * len(spec.seeds), "output": str(spec.output),
    "groups": {g: config.group_options(g) for g in ("model", "trainer", "eval", "launcher", "benchmark")},
    "model": sorted(p.name for p in (config.PACKAGE_DIR / "models" / "builtin").iterdir()),
    "benchmarks": {n: [hashlib.sha256((config.BENCHMARK_DATA_DIR / f"{n}.jsonl").read_bytes()).hexdigest(),
                       len(load_benchmark(n, source_override=str(config.BENCHMARK_DATA_DIR / f"{n}.jsonl"))[1])]
                   for n in ("aime24", "aime25", "amc23", "math500")},
    "licence": (config.BENCHMARK_DATA_DIR / "README.md").read_text(),
}
print(json.dumps(data))
"""
    out = json.loads(_run([str(python), "-c", probe], cwd=tmp_path, env=env).stdout.strip().splitlines()[-1])
    assert out["package"].startswith(str(site)) and out["conf"].startswith(str(site))
    assert out["sweep"] == str(site / "stare_lab" / "sweeps" / "demo.yaml")
    assert out["output"] == str(tmp_path / "runs")  # runs land under the current directory
    for group in ("model", "trainer", "eval"):  # the wheel holds every config of the source tree
        assert out["groups"][group] == sorted(p.stem for p in (ROOT / "stare_lab" / "conf" / group).glob("*.yaml"))
    assert {"cpu_small", "cpu_smollm2", "gpu_stare"} <= set(out["groups"]["trainer"])
    assert {"builtin", "smollm2"} <= set(out["groups"]["model"]) and "slurm" in out["groups"]["launcher"]
    assert set(BENCHMARKS) <= set(out["groups"]["benchmark"])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(out["model"])
    for name, (digest, rows) in out["benchmarks"].items():
        assert rows == {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500}[name]
        if SHARED_BENCHMARKS.is_dir():  # the copy the project was given
            assert digest == hashlib.sha256((SHARED_BENCHMARKS / f"{name}.jsonl").read_bytes()).hexdigest(), name
    assert "MIT License" in out["licence"] and "Mathematical Association of America" in out["licence"]
    assert not list(tmp_path.iterdir())  # reading wrote nothing


def test_stare_lab_train_runs_from_an_empty_directory(installed, tmp_path):
    _, script, env, _ = installed
    args = [
        "train",
        "trainer.max_steps=1",
        "trainer.save_steps=1",
        "trainer.num_generations=4",
        "trainer.per_device_train_batch_size=8",
        "trainer.gradient_accumulation_steps=1",
        "trainer.max_completion_length=8",
        "task.train_size=32",
        "task.heldout_size=4",
        "logger=none",
        "eval.n=2",
    ]
    out = _run([str(script), *args], cwd=tmp_path, env={**env, "STARE_LAB_THREADS": "1"}, timeout=600)
    run_dirs = [p for p in (tmp_path / "runs" / "train").iterdir()]
    assert len(run_dirs) == 1 and run_dirs[0].name in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing written outside the run folder
    status = json.loads((run_dirs[0] / "status.json").read_text())
    assert status["state"] == "finished", status
    assert (run_dirs[0] / "config.yaml").read_text().count("max_steps: 1") == 1
    bad = subprocess.run([str(script), "train", "method=nope"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("stare-lab: error: unknown method option 'nope'; valid: ")
