"""The committed listing of reasoning-gym's datasets (stare_lab/tasks/reasoning_gym_registry.py) is the
installed library's registry, so that the config checks that read it in place of the library can not go
stale; with it, a misspelt dataset, key or `rg:` benchmark is refused in one line without importing
reasoning_gym (~1.6 s), checked by the modules a real `stare-lab train` process has loaded, not by a timer.
"""

from __future__ import annotations

import pprint
import subprocess
import sys
import textwrap
from dataclasses import dataclass, fields

import pytest

from stare_lab.tasks import reasoning_gym_registry, reasoning_gym_specs
from stare_lab.tasks.reasoning_gym_specs import PACKAGE_PIN, create, installed_version, known_datasets, registry


def library_listing() -> dict[str, tuple[str, ...]]:
    """The listing as the installed library's registry gives it (what reasoning_gym_registry.py holds)."""
    return {
        name: tuple(f.name for f in fields(cfg) if f.name not in ("seed", "size"))
        for name, (_, cfg) in registry().items()
    }


def test_the_committed_listing_is_the_installed_librarys_registry():
    assert PACKAGE_PIN == f"reasoning-gym=={reasoning_gym_registry.VERSION}" == f"reasoning-gym=={installed_version()}"
    listing = library_listing()
    assert reasoning_gym_registry.DATASETS == listing, "paste into reasoning_gym_registry.py:\n" + pprint.pformat(
        listing
    )
    assert len(listing) == 105 and "knights_knaves" in listing and "composite" not in listing
    assert all({"seed", "size"} <= {f.name for f in fields(cfg)} for _, cfg in registry().values())  # the task's


def test_every_dataset_generates_at_its_defaults():
    """Why a dataset's default config (`{}`, every `rg:<dataset>` benchmark's) is not tried at check time."""
    failed = {}
    for name in registry():
        try:
            create(name, {}, seed=0, size=1)[0]
        except Exception as e:  # noqa: BLE001 - every failure named below
            failed[name] = repr(e)
    assert failed == {}


@dataclass
class NewConfig:
    seed: int = 0
    size: int = 1
    depth: int = 2


def test_another_installed_version_is_checked_against_its_own_registry(monkeypatch):
    fake = {"only_here": (object, NewConfig)}
    monkeypatch.setattr(reasoning_gym_specs, "installed_version", lambda: "0.2.0")
    monkeypatch.setattr(reasoning_gym_specs, "registry", lambda: fake)
    known_datasets.cache_clear()
    try:
        assert known_datasets() == {"only_here": ("depth",)}
    finally:
        monkeypatch.undo()
        known_datasets.cache_clear()
    assert known_datasets() is reasoning_gym_registry.DATASETS  # the pinned version: the listing, no import


REFUSE = """
    import sys
    from stare_lab.cli import main
    code = main(["train", *sys.argv[1:]])
    heavy = sorted(m for m in ("reasoning_gym", "torch", "transformers", "trl") if m in sys.modules)
    print("heavy:", heavy)
    sys.exit(code)
"""
RG = "task=reasoning_gym"


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            [RG, "task.datasets=[{name:knight_knaves}]"],
            "task.datasets: [0].name: unknown Reasoning Gym dataset 'knight_knaves'; "
            "closest: knights_knaves, knight_swap",
        ),
        (  # a later entry's name is refused before an earlier entry's config is tried on its generator
            [RG, "task.datasets=[{name:maze,config:{min_dist:2,max_dist:9}},{name:zebra_puzzle}]"],
            "task.datasets: [1].name: unknown Reasoning Gym dataset 'zebra_puzzle'; "
            "closest: zebra_puzzles, mahjong_puzzle, puzzle24",
        ),
        (
            [RG, "task.datasets=[{name:knights_knaves,config:{n_peple:2}}]"],
            "task.datasets: [0].config.n_peple: unknown key for knights_knaves (did you mean n_people?)",
        ),
        (
            ["eval.benchmarks=[rg:zebra_puzzle]"],
            "eval.benchmarks[0]: benchmark 'rg:zebra_puzzle': unknown Reasoning Gym dataset 'zebra_puzzle'; "
            "closest: zebra_puzzles, mahjong_puzzle, puzzle24",
        ),
    ],
)
def test_a_misspelt_name_or_key_is_refused_without_importing_reasoning_gym(argv, message):
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(REFUSE), *argv], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr == f"stare-lab: error: {message}\n"
    assert run.stdout == "heavy: []\n"


def test_a_config_of_the_generators_own_keys_is_still_tried_on_it():
    """What the listing can not know (a value the generator refuses) is its own refusal, the library imported."""
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(REFUSE),
            RG,
            "task.datasets=[{name:maze,config:{min_dist:9,max_dist:2}}]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr
    rejects = "maze rejects {'max_dist': 2, 'min_dist': 9}: max_dist must be >= min_dist"
    assert run.stderr == f"stare-lab: error: task.datasets: [0].config: {rejects}\n"
    assert run.stdout == "heavy: ['reasoning_gym']\n"
