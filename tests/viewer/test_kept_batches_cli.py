"""The command line over a sweep whose arms choose their tokens in the loss: `stare-lab sweep run` keeps
a batch for every arm that asks (kl_cov and clip_cov at scope microbatch, two updates per batch),
`stare-lab view` shows each of them as it trained and names every other arm with the reason, `stare-lab
plot` draws their selection figures and names the others; nothing says "set trainer.keep_batches_every"
where it is set. Run from a folder outside the checkout."""

from __future__ import annotations

import yaml
from sweep_fixtures import TINY

from stare_lab.cli import main
from stare_lab.record.kept_batch import kept_steps, load_run_batch
from stare_lab.viewer.page import sweep_runs
from stare_lab.viewer.wandb_export import page_data


def test_view_and_plot_cover_every_arm_and_name_those_without_a_batch(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    keep = {"trainer.keep_batches_every": 1}
    data = {
        "name": "loss_rules",
        "base": {
            "model": "builtin",
            "logger": "none",
            "overrides": {**TINY, "trainer.num_iterations": 2, "trainer.max_steps": 2},
        },
        "variants": {
            "kl_cov": {"method": "kl_cov", **keep},
            "clip_cov": {"method": "clip_cov", **keep},
            "full_unkept": {"method": "full"},
        },
        "seeds": [0],
        "eval": False,
        "launcher": {"name": "local", "workers": 1},
        "output": "runs",
    }
    sweep = tmp_path / "loss_rules.yaml"
    sweep.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["sweep", "run", str(sweep)]) == 0
    runs = dict(sweep_runs(sweep))
    by_method = {yaml.safe_load((d / "config.yaml").read_text())["method"]["name"]: (lab, d) for lab, d in runs.items()}
    for method in ("kl_cov", "clip_cov"):
        _, run = by_method[method]
        assert kept_steps(run) == [0]
        batch = load_run_batch(run)
        assert [u.index for u in batch.updates] == [0, 1] and batch.loss_meta["scope"] == "microbatch"
    assert kept_steps(by_method["full"][1]) == []

    # an arm added to the plan and not run yet
    data["variants"]["top_entropy"] = {"method": "top_entropy", **keep}
    sweep.write_text(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    assert main(["view", str(sweep), "--out", str(tmp_path / "page.html")]) == 0
    err = capsys.readouterr().err
    html = (tmp_path / "page.html").read_text()
    assert "set trainer.keep_batches_every" not in html + err
    page = page_data(tmp_path / "page.html")
    labels = {a["label"] for a in page["arms"]}
    assert labels == {by_method["kl_cov"][0], by_method["clip_cov"][0]}
    for arm in page["arms"]:
        own = [r for r in arm["rules"] if r["own"]]
        assert len(own) == 2 and all(r["reproduces_training"] is True for r in own)
        assert all("in the loss, pass" in r["label"] for r in own)
    missing = {m["label"]: m["reason"] for m in page["missing"]}
    full_label = by_method["full"][0]
    (new_label,) = set(missing) - {full_label}
    assert missing[full_label] == "trainer.keep_batches_every is 0: set it to keep batches"
    assert missing[new_label] == "it has not started (no run folder yet)"
    lines = [x for x in err.splitlines() if x.startswith("stare-lab view: not on the page:")]
    assert sorted(lines) == sorted(f"stare-lab view: not on the page: {k}: {v}" for k, v in missing.items())

    assert main(["plot", str(sweep), "--out", str(tmp_path / "figures")]) == 0
    out, err = capsys.readouterr()
    names = sorted(p.name for p in (tmp_path / "figures").glob("selection-*.png"))
    ids = sorted(d.name for m, (_, d) in by_method.items() if m in ("kl_cov", "clip_cov"))
    assert names == sorted(f"selection-{kind}-{i}.png" for i in ids for kind in ("quadrant", "steps"))
    # `plot` reads the runs of the plan that have a folder (cli._sweep_runs): the one not started has none
    named = [x for x in err.splitlines() if x.startswith("stare-lab plot: no selection figures for")]
    assert named == [
        f"stare-lab plot: no selection figures for {full_label} ({by_method['full'][1]}): "
        "trainer.keep_batches_every is 0: set it to keep batches"
    ]
