"""A real run (train, evaluate) ends with its evaluation and token page in its own W&B record,
read back from the offline files: the summary equals the run's eval/ record, and one W&B run
object (one offline folder) holds training, evaluation and the token page in rows of their own."""

from __future__ import annotations

from wandb_files import final_summary, history, media, run_records

from stare_lab.config.run_config import compose, save_config
from stare_lab.record import read_eval_results
from stare_lab.run.runner import execute


def test_run_summary_holds_eval_and_token_page_after_execute(tmp_path):
    cfg = compose(
        [
            "method=top_entropy",
            "logger=wandb_offline",
            "trainer.max_steps=2",
            "trainer.keep_batches_every=1",
            "eval.n=2",
            "eval.batch_size=512",
        ]
    )
    run_dir = tmp_path / cfg.run.id
    save_config(cfg, run_dir / "config.yaml")
    execute(run_dir)

    (result,) = [r for r in read_eval_results(run_dir) if r.get("final")]
    records = run_records(run_dir / "wandb", cfg.run.id)
    summary = final_summary(records)
    metrics = result["metrics"]
    assert summary["eval/arithmetic/avg@2"] == metrics["avg@2"]
    assert summary["eval/arithmetic/pass@2"] == metrics["pass@2"]
    assert [summary["eval/arithmetic/avg@2_ci_lo"], summary["eval/arithmetic/avg@2_ci_hi"]] == metrics["avg@2_ci"]
    assert summary["tokens/step"] == 1  # the last kept step
    assert 0.0 < summary["tokens/selected_frac/top_entropy"] < 1.0
    assert sorted(p.name for p in (run_dir / "figures").glob("*.png")) == [
        f"selection-quadrant-{run_dir.name}.png",
        f"selection-steps-{run_dir.name}.png",
    ]

    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1  # not resumed after training
    rows = history(records)
    assert [r["_step"] for r in rows if "reward" in r] == [1, 2]
    (point,) = [r for r in rows if "eval/step" in r]
    assert point["eval/step"] == 2 and point["eval/arithmetic/avg@2"] == metrics["avg@2"]
    assert "reward" not in point and point["_step"] > 2  # its own row, after training's
    (page,) = [r for r in rows if media(r, "tokens/page")]
    assert page["tokens/step"] == 1 and "reward" not in page and "eval/step" not in page
