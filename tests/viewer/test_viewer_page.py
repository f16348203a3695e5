"""The token page in a real browser (headless Chromium): the script runs without error, the DOM holds one
element per token of every rollout and a control per rule and signal, the screenshot is not blank, and
the data the page embeds (read back from the dumped DOM) equals the rules applied to the saved batch
and a loop Jaccard. Bad input: one error line, exit 2, nothing written."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from synthetic_batch import write_random_batch

from stare_lab.methods import LossBatch, RuleState, TrainerValues, get_method, list_methods
from stare_lab.viewer import batch_path, load_batch, main_view, render_run, render_sweep
from stare_lab.viewer.browser import chromium_path, dump_dom, screenshot

needs_browser = pytest.mark.skipif(
    chromium_path() is None, reason="headless Chromium is not installed: apt-get install -y chromium (.ci/run does)"
)


class PageDom(HTMLParser):
    """What the test reads from the dumped DOM: body attributes, controls, token spans per rollout, the data."""

    def __init__(self, html: str):
        super().__init__()
        self.body: dict[str, str] = {}
        self.buttons: list[dict[str, str | None]] = []
        self.tokens: dict[int, int] = {}
        self.errors = ""
        self._row: int | None = None
        self._depth = 0
        self._in: str | None = None
        self.data_text = ""
        self.feed(html)
        self.data = json.loads(self.data_text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag == "button":
            self.buttons.append(a)
        elif tag == "div" and "data-row" in a:
            self._row, self._depth = int(a["data-row"]), 0
            self.tokens[self._row] = 0
        elif tag == "span" and self._row is not None and (a.get("class") or "").split()[:1] == ["tok"]:
            self.tokens[self._row] += 1
        elif tag == "script" and a.get("id") == "data":
            self._in = "data"
        elif tag == "div" and a.get("id") == "errors":
            self._in = "errors"
        if tag == "div" and self._row is not None:
            self._depth += 1

    def handle_endtag(self, tag):
        if tag == "div" and self._row is not None:
            self._depth -= 1
            if self._depth == 0:
                self._row = None
        if tag in ("script", "div"):
            self._in = None

    def handle_data(self, data):
        if self._in == "data":
            self.data_text += data
        elif self._in == "errors":
            self.errors += data


def decode(s: str, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=dtype)


def rule_outputs(batch):
    """{key: RuleOutput} of every rule on the loaded batch, computed here from the batch alone."""
    trainer = TrainerValues(**batch.meta["trainer"])
    out = {}
    for key, name, params in [("run:" + batch.run_rule["name"], batch.run_rule["name"], batch.run_rule["params"])] + [
        (n, n, {}) for n in list_methods()
    ]:
        rule = get_method(name, **params)
        state = RuleState.from_dict(batch.rule_state)
        state.trainer = trainer
        if not key.startswith("run:"):
            state.memory = {}
        stats = batch.token_stats(rule.attn_layers)
        if any(getattr(stats, n, None) is None for n in rule.needs_for(trainer)):
            continue
        out[key] = rule(stats, state)
        if rule.changes_loss:  # the page selects the tokens its loss treats otherwise than PPO's
            old = stats.old_logp if stats.old_logp is not None else stats.logp
            selected = out[key].selected if out[key].selected is not None else stats.valid
            terms = rule.loss_terms(
                LossBatch(
                    stats.logp, old, stats.advantages, stats.mask, stats.entropy, selected, trainer, stats.ref_logp
                )
            )
            if terms.touched:
                out[key].selected = torch.stack([m & stats.valid for m in terms.touched.values()]).any(0)
    return out


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    run = tmp_path_factory.mktemp("viewer") / "run"
    for step in (0, 5, 10):
        write_random_batch(
            run,
            step,
            B=12,
            T=20,
            G=4,
            seed=3,
            run_rule={"name": "stare", "params": {"H_tgt": 10.0, "P": 0.2, "W": 1.3}},
        )
    path = render_run(run, step=5)
    return run, path, PageDom(dump_dom(path))


@needs_browser
def test_page_runs_in_chromium_with_a_span_per_token_and_a_control_per_rule_and_signal(page):
    run, path, dom = page
    assert path == run / "batches" / "step-5.html"
    assert dom.body.get("data-ok") == "1" and "data-error" not in dom.body, dom.body
    assert dom.errors.strip() == ""
    batch = load_batch(batch_path(run, 5))
    assert dom.tokens == {i: n for i, n in enumerate(batch.lengths)}
    assert sum(dom.tokens.values()) == int(batch.mask.sum()) > 0 and 0 in dom.tokens.values()  # the empty row too
    rules = [b["data-key"] for b in dom.buttons if b.get("data-kind") == "rule"]
    signals = [b["data-key"] for b in dom.buttons if b.get("data-kind") == "signal"]
    assert rules == ["run:stare", *list_methods()]
    assert signals == ["entropy", "surprisal", "attn_entropy", "js", "p2"]
    assert not any("disabled" in b for b in dom.buttons)  # every statistic is in the batch


@needs_browser
def test_embedded_weights_equal_the_rules_on_the_saved_batch(page):
    run, _, dom = page
    batch = load_batch(batch_path(run, 5))
    arm = dom.data["arms"][0]
    valid = batch.mask > 0
    expected = rule_outputs(batch)
    assert sorted(expected) == sorted(r["key"] for r in arm["rules"])
    ids = decode(arm["ids"], "<i4")
    assert np.array_equal(ids, batch.completion_ids[valid].numpy())
    for r in arm["rules"]:
        out = expected[r["key"]]
        w = decode(r["weights"], "<f4")
        assert np.array_equal(w, out.weights[valid].numpy()), r["key"]
        sel = out.selected if out.selected is not None else valid
        assert np.array_equal(decode(r["selected"], "u1").astype(bool), sel[valid].numpy()), r["key"]
        assert r["selected_frac"] == pytest.approx(float(sel[valid].sum()) / float(valid.sum()))
    own = next(r for r in arm["rules"] if r["own"])
    assert own["params"]["W"] == 1.3 and decode(own["weights"], "<f4").max() == np.float32(1.3)  # gate open: L+ boosted
    # the surprisal the page colours by is −logp of the batch
    surprisal = next(s for s in arm["signals"] if s["key"] == "surprisal")
    assert np.array_equal(decode(surprisal["values"], "<f4"), (-batch.stats["logp"])[valid].numpy())


@needs_browser
def test_overlap_matrix_equals_a_loop_jaccard(page):
    _, _, dom = page
    arm = dom.data["arms"][0]
    sets = {r["key"]: {i for i, s in enumerate(decode(r["selected"], "u1")) if s} for r in arm["rules"]}
    keys, matrix = arm["overlap"]["keys"], arm["overlap"]["matrix"]
    assert keys == [r["key"] for r in arm["rules"]]
    for i, a in enumerate(keys):
        for j, b in enumerate(keys):
            union = sets[a] | sets[b]
            want = len(sets[a] & sets[b]) / len(union) if union else 1.0
            assert matrix[i][j] == pytest.approx(want, abs=1e-12), (a, b)
    assert any(0 < v < 1 for row in matrix for v in row)


@needs_browser
def test_screenshot_is_not_blank(page, tmp_path):
    from matplotlib.image import imread

    _, path, _ = page
    png = screenshot(path, tmp_path / "shot.png")
    pixels = imread(png)[..., :3]
    assert pixels.shape[0] >= 900 and pixels.shape[1] >= 1300
    assert pixels.std() > 0.05  # text, tables and coloured tokens, not one colour
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50


def test_rule_missing_a_statistic_is_shown_as_not_computable(tmp_path):
    run = tmp_path / "run"
    p = write_random_batch(run, 1, B=8, T=10)
    batch = load_batch(p)
    del batch.stats["js"]
    from stare_lab.viewer.page import arm_data

    arm = arm_data(batch, label="x", run_dir=run)
    ict = next(r for r in arm["rules"] if r["key"] == "ict")
    assert ict["computable"] is False and ict["reason"] == "not computable: needs js"
    assert "ict" not in arm["overlap"]["keys"] and "stare" in arm["overlap"]["keys"]


def _snapshot(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@pytest.mark.parametrize("case", ["no_batches", "step_not_kept", "corrupt", "truncated", "foreign"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, case):
    run = tmp_path / "run"
    run.mkdir()
    argv = [str(run)]
    if case != "no_batches":
        for step in (2, 4):
            write_random_batch(run, step, B=4, T=6)
    if case == "step_not_kept":
        argv += ["--step", "3"]
    elif case == "corrupt":
        batch_path(run, 4).write_bytes(b"\x00garbage" * 10)
    elif case == "truncated":
        data = batch_path(run, 4).read_bytes()
        batch_path(run, 4).write_bytes(data[: len(data) // 2])
    elif case == "foreign":
        from safetensors.torch import save_file

        save_file({"x": torch.zeros(2)}, str(batch_path(run, 4)))
    before = _snapshot(tmp_path)
    assert main_view(argv + ["--out", str(tmp_path / "page.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("stare-lab: error: ")
    assert _snapshot(tmp_path) == before
    if case == "no_batches":
        assert "has no kept batches" in err and str(run) in err
    elif case == "step_not_kept":
        assert "step 3 was not kept" in err and "kept steps: 2, 4" in err
    else:
        assert "step-4.safetensors is not a readable batch record" in err and "kept steps: 2, 4" in err


def test_view_of_a_sweep_has_one_arm_per_run_with_the_step(tmp_path, capsys):
    from stare_lab.viewer.page import sweep_runs

    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "base": {"model": "builtin", "logger": "none"},
                "grid": {"method": ["stare", "anchor", "full"]},
                "seeds": [0],
                "output": str(tmp_path / "runs"),
            }
        )
    )
    runs = sweep_runs(sweep)
    assert len(runs) == 3
    for k, (_, d) in enumerate(runs[:2]):
        for step in (0, 5):
            write_random_batch(d, step, B=8, T=10, seed=k)
    write_random_batch(runs[0][1], 7, B=8, T=10)
    path = render_sweep(sweep)  # the last step every run with batches kept: 5
    html = path.read_text()
    data = json.loads(html.split('<script id="data" type="application/json">')[1].split("</script>")[0])
    assert [a["label"] for a in data["arms"]] == [runs[0][0], runs[1][0]] and {a["step"] for a in data["arms"]} == {5}
    # run folders relative to the page, no time of writing: the same runs give the same page anywhere
    on_page = [(path.parent / a["run_dir"]).resolve() for a in data["arms"]]
    assert on_page == [runs[0][1].resolve(), runs[1][1].resolve()]
    assert [(path.parent / m["run_dir"]).resolve() for m in data["missing"]] == [runs[2][1].resolve()]
    assert "generated" not in data and str(tmp_path) not in html
    assert main_view([str(sweep), "--step", "7", "--out", str(tmp_path / "s7.html")]) == 0
    assert main_view([str(sweep), "--step", "6"]) == 2
    assert "step 6 was not kept by any run" in capsys.readouterr().err


def test_a_batch_without_valid_tokens_or_rewards_still_renders(tmp_path):
    from synthetic_batch import random_batch_tensors

    from stare_lab.viewer import save_batch

    kw = random_batch_tensors(B=4, T=5, G=2)
    kw["mask"] = torch.zeros(4, 5)
    kw["rewards"] = torch.full((4,), float("nan"))
    save_batch(
        batch_path(tmp_path, 0),
        0,
        **kw,
        run_rule={"name": "rsi_band", "params": {"high": float("inf")}},
        meta={
            "num_layers": 4,
            "attn_layers": [2],
            "trainer": {
                "epsilon_low": 0.2,
                "epsilon_high": 0.2,
                "beta": 0.0,
                "loss_type": "dapo",
                "num_generations": 2,
            },
        },
    )
    page = render_run(tmp_path)
    data = json.loads(page.read_text().split('<script id="data" type="application/json">')[1].split("</script>")[0])
    arm = data["arms"][0]
    assert arm["rules"][0]["params"]["high"] == "inf" and arm["run_rule"]["params"]["high"] == "inf"
    assert [r["reward"] for r in arm["rollouts"]] == [None] * 4 and [r["length"] for r in arm["rollouts"]] == [0] * 4
    assert all(r["computable"] and r["selected_frac"] == 0.0 for r in arm["rules"])
    if chromium_path() is not None:
        dom = PageDom(dump_dom(page))
        assert dom.body.get("data-ok") == "1" and "data-error" not in dom.body and sum(dom.tokens.values()) == 0
