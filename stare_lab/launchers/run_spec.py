"""One run of a sweep as expansion makes it (stare_lab.plan.expand) and the launch, its jobs and the
progress display pass it on: its overrides, resolved config, id, label and folder. A module of its
own, below expansion, so that the jobs (stare_lab.launchers.jobs), which the launchers and through them
the sweep schema import, can name it without importing what expands a sweep."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


@dataclass
class RunSpec:
    overrides: list[str]  # Hydra overrides: compose(overrides) gives this run's config
    config: dict[str, Any]  # the resolved config as plain data
    id: str
    label: str
    variant: str | None
    seed: int
    run_dir: Path
    _cfg: DictConfig | None = field(default=None, repr=False, compare=False)
    # False: a reading command's run of a rule it has not imported, id provisional (stare_lab.plan.records)
    resolved: bool = True

    @property
    def cfg(self) -> DictConfig:
        if self._cfg is None:
            self._cfg = OmegaConf.create(self.config)
        return self._cfg
