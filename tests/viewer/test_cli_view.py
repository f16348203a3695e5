"""The token viewer through the command line: `stare-lab train` keeps batches, `stare-lab view`
writes the page, `stare-lab plot` adds the selection figures, bad input is one line and exit 2."""

from __future__ import annotations

from stare_lab.cli import main
from stare_lab.record.kept_batch import kept_steps
from stare_lab.viewer.wandb_export import page_data


def test_train_keeps_batches_and_view_plot_show_them(tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "method=top_entropy",
                "trainer.max_steps=2",
                "trainer.keep_batches_every=1",
                "logger=none",
                "eval.enabled=false",
                f"run_dir={run}",
            ]
        )
        == 0
    )
    assert kept_steps(run) == [0, 1]

    capsys.readouterr()
    assert main(["view", str(run), "--step", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stare-lab: error: step 7 was not kept in run {run}; kept steps: 0, 1"]
    assert not list(run.glob("**/*.html"))  # nothing written

    page = tmp_path / "page.html"
    assert main(["view", str(run), "--step", "1", "--out", str(page)]) == 0
    arms = page_data(page)["arms"]
    assert len(arms) == 1 and arms[0]["step"] == 1
    own = [r for r in arms[0]["rules"] if r["own"]]
    assert [r["name"] for r in own] == ["top_entropy"] and own[0]["reproduces_training"] is True

    figures = tmp_path / "figures"
    assert main(["plot", str(tmp_path), "--out", str(figures)]) == 0
    names = sorted(p.name for p in figures.glob("selection-*.png"))
    assert names == [f"selection-quadrant-{run.name}.png", f"selection-steps-{run.name}.png"]
