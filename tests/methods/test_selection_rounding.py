"""Selections that do not depend on float rounding (issue: demo numbers that move with the CPU type).

ICT's score, JS to the group mean, sits at the noise floor of float32 arithmetic for most tokens of
a model with peaked distributions, and its top-10% cut falls among those tokens. These tests check
that the value does not depend on how its reductions are chunked or vectorised (float64 sums,
signals/js.py), and that the selection compares scores on a grid with ties broken by the seeded
order (select.py `resolution`), against a slow reference.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from js_groups import agreeing_group

from stare_lab.core.utils import cpu_kernel_sets, kernel_env
from stare_lab.methods.select import select_top
from stare_lab.signals.js import chunked_js_to_group_mean, js_to_group_mean


def test_js_of_the_same_logits_is_the_same_float32_value_under_every_chunking():
    """The reductions (log-softmax, the group mean, the KL sums) run in float64: given the same
    logits, every chunking gives the same float32 value, to the bit."""
    hidden, weight, group, live = agreeing_group()
    logits = hidden @ weight.T  # projected once; the identity projection below hands the same logits to every chunk
    T = hidden.shape[1]
    whole = chunked_js_to_group_mean(logits, lambda z: z, group, live, chunk_positions=T)
    assert 0 < float(whole.median()) < 1e-5  # the regime of the demo: most values at the float32 noise floor
    for chunk in (1, 3, 7, 16):
        assert torch.equal(chunked_js_to_group_mean(logits, lambda z: z, group, live, chunk_positions=chunk), whole)


def test_js_under_every_chunking_differs_far_below_the_grid():
    """Projected per chunk, the logits themselves can differ in their last bits (a [G, 1, H] chunk
    takes a matrix-vector kernel): JS moves by far less than ict's 1e-6 grid."""
    hidden, weight, group, live = agreeing_group()
    whole = js_to_group_mean(hidden, weight, group, live, chunk_positions=hidden.shape[1])
    for chunk in (1, 3, 7, 16):
        diff = (js_to_group_mean(hidden, weight, group, live, chunk_positions=chunk) - whole).abs().max()
        assert float(diff) < 1e-8, chunk


def test_js_matches_a_float64_reference():
    hidden, weight, group, live = agreeing_group(seed=1, B=8, T=6, H=8, V=30)
    got = js_to_group_mean(hidden, weight, group, live)
    logits = (hidden.float() @ weight.float().T).double()
    p = torch.softmax(logits, -1)
    for b in range(8):
        rows = (group == group[b]).nonzero().squeeze(1)
        for t in range(6):
            mean = p[rows, t].mean(0)
            m = 0.5 * (p[b, t] + mean)
            js = 0.5 * sum(
                float(p[b, t, v] * math.log(p[b, t, v] / m[v]) + mean[v] * math.log(mean[v] / m[v])) for v in range(30)
            )
            assert float(got[b, t]) == pytest.approx(js, rel=1e-5, abs=1e-12)


def test_ict_selection_is_the_same_under_every_chunking():
    hidden, weight, group, live = agreeing_group(seed=2)
    T = hidden.shape[1]
    valid = live.bool()
    picks = []
    for chunk in (1, 7, T):
        js = js_to_group_mean(hidden, weight, group, live, chunk_positions=chunk)
        gen = torch.Generator().manual_seed(5)
        picks.append(select_top(js, valid, group, 0.1, generator=gen, resolution=1e-6))
    assert torch.equal(picks[0], picks[2]) and torch.equal(picks[1], picks[2])


def _reference_top(score, valid, rho, resolution, tie_key):
    """Slow reference: keep ⌈ρ·n⌉ valid tokens ordered by (round(score/resolution) desc, seeded key asc)."""
    items = [
        (-round(float(score.reshape(-1)[i]) / resolution), float(tie_key[i]), i)
        for i in range(score.numel())
        if bool(valid.reshape(-1)[i])
    ]
    k = math.ceil(rho * len(items) - 1e-9)
    out = torch.zeros(score.numel(), dtype=torch.bool)
    for _, _, i in sorted(items)[:k]:
        out[i] = True
    return out.reshape(score.shape)


@pytest.mark.parametrize("seed", range(5))
def test_select_top_on_a_grid_matches_the_reference(seed):
    g = torch.Generator().manual_seed(seed)
    # a noise floor (1e-10..1e-7) under a few real values, as ICT's scores are
    score = torch.where(
        torch.rand(6, 20, generator=g) < 0.85, torch.rand(6, 20, generator=g) * 1e-7, torch.rand(6, 20, generator=g)
    )
    valid = torch.rand(6, 20, generator=g) < 0.9
    group = torch.zeros(6, dtype=torch.long)
    got = select_top(score, valid, group, 0.3, generator=torch.Generator().manual_seed(11), resolution=1e-6)
    tie_key = torch.rand(score.numel(), generator=torch.Generator().manual_seed(11))
    assert torch.equal(got, _reference_top(score, valid, 0.3, 1e-6, tie_key))


def test_last_bit_noise_does_not_move_a_selection_on_the_grid():
    g = torch.Generator().manual_seed(3)
    score = torch.rand(8, 30, generator=g) * 1e-7  # the cut falls inside the noise floor
    score[:, :2] = torch.rand(8, 2, generator=g)  # a few real departures
    valid = torch.ones(8, 30, dtype=torch.bool)
    group = torch.zeros(8, dtype=torch.long)
    # another CPU's last bits of the logits: JS of agreeing rollouts moves by ~1% (see the chunking test)
    noisy = score * (1 + 1e-2 * torch.randn(8, 30, generator=g))

    def pick(s, resolution):
        return select_top(s, valid, group, 0.1, generator=torch.Generator().manual_seed(0), resolution=resolution)

    assert torch.equal(pick(score, 1e-6), pick(noisy, 1e-6))
    assert not torch.equal(pick(score, None), pick(noisy, None))  # the failure the grid removes


def test_hand_case_ties_on_the_grid_follow_the_seeded_order():
    score = torch.tensor([[0.5, 3e-9, 2e-9, 1e-9, 0.0, 0.25]])
    valid = torch.ones_like(score, dtype=torch.bool)
    group = torch.zeros(1, dtype=torch.long)
    got = select_top(score, valid, group, 0.5, generator=torch.Generator().manual_seed(0), resolution=1e-6)
    # ⌈0.5·6⌉ = 3: both real values, then one of the four grid ties (3e-9, 2e-9, 1e-9, 0 all round to 0)
    key = torch.rand(6, generator=torch.Generator().manual_seed(0))
    tie = min(range(1, 5), key=lambda i: float(key[i]))
    want = torch.zeros(6, dtype=torch.bool)
    want[[0, 5, tie]] = True
    assert torch.equal(got[0], want)


def test_select_top_refuses_a_grid_it_cannot_honour():
    s = torch.rand(2, 3)
    v = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="resolution"):
        select_top(s, v, torch.zeros(2, dtype=torch.long), 0.5, ties="quantile", resolution=1e-6)
    with pytest.raises(ValueError, match="resolution"):
        select_top(s, v, torch.zeros(2, dtype=torch.long), 0.5, resolution=0.0)


def test_select_top_on_transposed_inputs_equals_contiguous():
    g = torch.Generator().manual_seed(4)
    score = torch.rand(12, 5, generator=g).T  # [5, 12], non-contiguous
    valid = (torch.rand(12, 5, generator=g) < 0.8).T
    group = torch.tensor([0, 0, 1, 1, 2])
    for scope in ("batch", "group", "sequence"):
        a = select_top(score, valid, group, 0.3, scope=scope, generator=torch.Generator().manual_seed(1))
        b = select_top(
            score.contiguous(), valid.contiguous(), group, 0.3, scope=scope, generator=torch.Generator().manual_seed(1)
        )
        assert torch.equal(a, b) and int(a.sum()) > 0, scope


_JS_UNDER_ISA = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {tests!r})
    from js_groups import agreeing_group
    from stare_lab.methods.select import select_top
    from stare_lab.signals.js import js_to_group_mean
    h, w, g, live = agreeing_group(seed=7)
    js = js_to_group_mean(h, w, g, live, chunk_positions=5)
    pick = select_top(js, live.bool(), g, 0.1, generator=torch.Generator().manual_seed(0), resolution=1e-6)
    torch.save((js, pick, torch.backends.cpu.get_cpu_capability()), {out!r})
    """
)


def _js_under(tmp_path: Path, kernel_set: str):
    """(JS, selection, the kernels the child reported) computed in a child that runs `kernel_set`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **kernel_env(kernel_set))
    out = tmp_path / f"{kernel_set}.pt"
    code = _JS_UNDER_ISA.format(tests=str(Path(__file__).parents[1] / "support"), out=str(out))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    return torch.load(out)


@pytest.mark.parametrize("wider", ["avx2", "avx512"])
def test_ict_selection_is_the_same_under_another_vector_width(tmp_path, wider):
    """The CPU's vector width, emulated: torch's kernels set by ATEN_CPU_CAPABILITY in each child, the
    scalar ones against a wider set the CPU has (never one it lacks: torch runs what it is asked for and
    dies of SIGILL). The logits differ in their last bits, JS by far less than the grid, and the
    selection not at all."""
    if wider not in cpu_kernel_sets():
        pytest.skip(f"this CPU (or ATEN_CPU_CAPABILITY) has no {wider} kernels: only {', '.join(cpu_kernel_sets())}")
    js_a, pick_a, ran_a = _js_under(tmp_path, "default")
    js_b, pick_b, ran_b = _js_under(tmp_path, wider)
    assert (ran_a, ran_b) == ("DEFAULT", wider.upper())  # the kernels each child ran
    assert int(pick_a.sum()) == math.ceil(0.1 * pick_a.numel())
    assert float((js_a - js_b).abs().max()) < 1e-8
    assert torch.equal(pick_a, pick_b)
