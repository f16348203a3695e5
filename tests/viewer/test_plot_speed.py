"""Figures drawn only when what they were drawn from changed (issue 30.2): the stamp in each PNG, kept
figures left untouched (same bytes, same modification time), a changed run or metric redrawn alone, a
run's own figures copied, and drawing in parallel giving the bytes drawing here gives."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
from synthetic_batch import write_random_batch

from stare_lab.analysis.plots import plot_training
from stare_lab.cli import main
from stare_lab.record.figure_stamps import STAMP_KEY, current, read_stamp
from stare_lab.record.kept_batch import batch_path
from stare_lab.viewer.figures import plot_selection, run_stamp

RUNS = ("aaa", "bbb", "ccc")


def _runs(root: Path) -> list[Path]:
    for k, name in enumerate(RUNS):
        for step in (0, 5):
            write_random_batch(root / name, step, B=8, T=12, seed=k)
    return [root / name for name in RUNS]


def _state(folder: Path) -> dict[str, tuple[int, bytes]]:
    """name -> (modification time in ns, bytes) of every file in `folder`."""
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.iterdir())}


def test_the_stamp_is_a_text_chunk_of_the_png(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    fig = Figure(figsize=(1, 1))
    FigureCanvasAgg(fig)
    fig.savefig(tmp_path / "a.png", format="png", metadata={STAMP_KEY: "abc123"})
    fig.savefig(tmp_path / "b.png", format="png")
    assert Image.open(tmp_path / "a.png").text[STAMP_KEY] == "abc123"  # PIL reads the same chunk
    assert read_stamp(tmp_path / "a.png") == "abc123" and current(tmp_path / "a.png", "abc123")
    assert read_stamp(tmp_path / "b.png") is None and not current(tmp_path / "b.png", None)
    (tmp_path / "c.png").write_bytes(b"not a png")
    assert read_stamp(tmp_path / "c.png") is None and read_stamp(tmp_path / "missing.png") is None
    with open(tmp_path / "a.png", "ab") as f:  # bytes after the image do not hide it
        f.write(b"appended")
    assert read_stamp(tmp_path / "a.png") == "abc123"


def test_selection_figures_are_drawn_once_and_again_only_for_the_run_that_changed(tmp_path):
    root = tmp_path / "runs" / "sweep"
    runs = _runs(root)
    out = tmp_path / "figs"
    first = plot_selection(root, out)
    names = sorted(f"selection-{kind}-{run}.png" for run in RUNS for kind in ("quadrant", "steps"))
    assert sorted(p.name for p in first) == names
    for p in first:
        assert read_stamp(p) == run_stamp(root / p.stem.split("-", 2)[2])
    before = _state(out)

    assert plot_selection(root, out) == first  # nothing changed: every figure kept as it is
    assert _state(out) == before

    later = batch_path(runs[0], 5).stat().st_mtime_ns + 10**9
    os.utime(batch_path(runs[0], 5), ns=(later, later))  # aaa's batch touched, same bytes: nothing to draw
    write_random_batch(runs[1], 5, B=8, T=12, seed=7)  # bbb kept another batch at step 5
    assert plot_selection(root, out) == first
    after = _state(out)
    changed = sorted(name for name in after if after[name][0] != before[name][0])
    assert changed == ["selection-quadrant-bbb.png", "selection-steps-bbb.png"]
    new, other = read_stamp(out / "selection-steps-bbb.png"), read_stamp(out / "selection-steps-aaa.png")
    assert new == run_stamp(runs[1]) != other


def test_a_figure_without_its_stamp_or_with_another_is_drawn_again(tmp_path):
    root = tmp_path / "runs" / "sweep"
    _runs(root)
    out = tmp_path / "figs"
    plot_selection(root, out)
    good = (out / "selection-steps-aaa.png").read_bytes()
    (out / "selection-steps-aaa.png").write_bytes(b"garbage")
    shutil.copyfile(out / "selection-quadrant-ccc.png", out / "selection-quadrant-bbb.png")  # ccc's stamp
    plot_selection(root, out)
    assert (out / "selection-steps-aaa.png").read_bytes() == good
    assert read_stamp(out / "selection-quadrant-bbb.png") == run_stamp(root / "bbb")


def test_a_runs_own_current_figures_are_copied_not_drawn(tmp_path):
    root = tmp_path / "runs" / "sweep"
    runs = _runs(root)
    for run in runs:
        plot_selection(run, run / "figures")  # what a run's publishing step draws
    marked = runs[0] / "figures" / "selection-steps-aaa.png"
    marked.write_bytes(marked.read_bytes() + b"copied")  # a copy is byte for byte the run's own
    stale = runs[2] / "figures" / "selection-quadrant-ccc.png"
    write_random_batch(runs[2], 5, B=8, T=12, seed=7)  # ccc kept another batch after drawing its own
    out = tmp_path / "figs"
    plot_selection(root, out)
    assert (out / "selection-steps-aaa.png").read_bytes() == marked.read_bytes()
    assert read_stamp(out / "selection-quadrant-ccc.png") == run_stamp(runs[2]) != read_stamp(stale)


def test_the_same_runs_in_another_folder_draw_the_same_bytes(tmp_path):
    """A stamp reads the kept batches' content and the config without `run.root`, not modification
    times or paths: the demo's committed figures come out byte-identical from any checkout."""
    first = tmp_path / "a" / "runs" / "sweep"
    _runs(first)
    for run in RUNS:
        (first / run / "config.yaml").write_text(f"method: {{name: full}}\nrun: {{root: {first.parent}, id: {run}}}\n")
    second = tmp_path / "b" / "elsewhere" / "sweep"
    shutil.copytree(first, second)  # new modification times
    for run in RUNS:
        config = second / run / "config.yaml"
        config.write_text(config.read_text().replace(str(first.parent), str(second.parent)))
    one, two = plot_selection(first, tmp_path / "f1"), plot_selection(second, tmp_path / "f2")
    assert [p.name for p in one] == [p.name for p in two] and len(one) == 6
    for a, b in zip(one, two, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
    (second / "aaa" / "config.yaml").write_text("method: {name: top_entropy}\nrun: {id: aaa}\n")
    assert run_stamp(second / "aaa") != run_stamp(first / "aaa")  # the rule is part of the stamp


def test_drawing_in_parallel_gives_the_bytes_of_drawing_here(tmp_path):
    root = tmp_path / "runs" / "sweep"
    _runs(root)
    parallel = plot_selection(root, tmp_path / "par", processes=2)
    serial = plot_selection(root, tmp_path / "ser", processes=1)
    assert [p.name for p in parallel] == [p.name for p in serial] and len(parallel) == 6
    for a, b in zip(parallel, serial, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


def _training_frame(value_of_b: float = 0.5) -> pd.DataFrame:
    rows = []
    for run, arm in (("r1", "full"), ("r2", "stare")):
        for step in (1, 2, 3):
            for metric in ("reward", "entropy"):
                value = value_of_b if (run, metric, step) == ("r2", "entropy", 2) else step * 0.1
                rows.append(dict(run=run, arm=arm, rule=arm, seed=0, step=step, metric=metric, value=value))
    return pd.DataFrame(rows)


def test_training_figures_redraw_only_the_metric_whose_rows_changed(tmp_path):
    out = tmp_path / "figs"
    paths = plot_training(_training_frame(), out)
    assert [p.name for p in paths] == ["train_reward.png", "train_entropy.png"]
    before = _state(out)
    assert plot_training(_training_frame(), out) == paths and _state(out) == before
    plot_training(_training_frame(value_of_b=0.9), out)
    after = _state(out)
    assert after["train_reward.png"] == before["train_reward.png"]
    assert after["train_entropy.png"][1] != before["train_entropy.png"][1]
    plot_training(_training_frame(value_of_b=0.9), out, band="std")  # another option: drawn again
    assert _state(out)["train_reward.png"][1] != after["train_reward.png"][1]


def test_plot_command_twice_rewrites_nothing(tmp_path, capsys):
    root = tmp_path / "runs" / "sweep"
    _runs(root)
    out = tmp_path / "figs"
    assert main(["plot", str(root), "--out", str(out)]) == 0
    first = capsys.readouterr().out
    before = _state(out)
    assert main(["plot", str(root), "--out", str(out)]) == 0
    assert capsys.readouterr().out == first and _state(out) == before


def test_no_selection_draws_no_selection_figure(tmp_path, capsys):
    root = tmp_path / "runs" / "sweep"
    _runs(root)  # runs with kept batches and nothing else to plot
    out = tmp_path / "figs"
    assert main(["plot", str(root), "--out", str(out), "--no-selection"]) == 2
    assert capsys.readouterr().err.strip() == f"stare-lab: error: nothing to plot under {root}"
    assert not out.exists()


def test_planned_runs_without_a_record_are_named_not_dropped(tmp_path, capsys):
    from stare_lab.viewer.page import sweep_runs

    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        "name: s\nbase: {model: builtin, logger: none}\ngrid: {method: [stare, anchor, full]}\n"
        f"seeds: [0]\noutput: {tmp_path / 'runs'}\n"
    )
    runs = sweep_runs(sweep)
    for k, (_, run_dir) in enumerate(runs[:2]):  # the third run has not started: no folder
        write_random_batch(run_dir, 0, B=8, T=12, seed=k)
        (run_dir / "config.yaml").write_text("method: {name: stare}\n")
    assert main(["plot", str(sweep), "--out", str(tmp_path / "figs")]) == 0
    err = capsys.readouterr().err
    assert f"1 planned run(s) have no record under {tmp_path / 'runs' / 's'} yet and are not shown: {runs[2][0]}" in err
    assert runs[0][0] not in err and runs[1][0] not in err
