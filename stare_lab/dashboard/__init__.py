"""Layer 4, a reader of records: the W&B dashboard of a sweep.
May import layers 1-3; never viewer or analysis.

The W&B dashboard of a sweep (docs/dashboard.md).

- `logged`: what the sweep's runs logged, read back from their W&B files with W&B's own reader;
- `view`: the workspace (W&B's `wandb-workspaces` library) built from those keys;
- `build`: `stare-lab dashboard SWEEP` (`main`), `build_dashboard`, and `publish_after_sweep` for
  the end of `stare-lab sweep run`.

`wandb_workspaces` (with wandb and pydantic) is imported only when a view is built.
"""

from stare_lab.dashboard.build import build_dashboard, load_workspace, main, publish_after_sweep

__all__ = ["build_dashboard", "load_workspace", "main", "publish_after_sweep"]
