"""JS of a group to its mean does not depend on the batch around the group, to the bit (issue 36).

A group split over ranks is completed there (signals.statistics.js_for_split_groups) inside a batch of
another T and other rows than on one process. The float32 projection of the hidden states to logits
takes its kernel from the shapes, strides and alignment of its input, and those used to follow the
batch: on an AVX2/AVX-512 AMD EPYC the 2-process JS differed from 1 process in its last bits
(tests/training/test_distributed.py). Here one group's rows, unchanged, sit inside other batches:
padded to another T with garbage behind the live positions, other rows before them.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from stare_lab.signals.js import chunked_js_to_group_mean

H, V = 64, 151  # V not a multiple of any vector width


def _group(G: int, L: int, seed: int):
    """G rollouts of one prompt, the longest L long (two of them), the others shorter."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(G, L, H, generator=g)
    weight = torch.randn(V, H, generator=g) / H**0.5  # logits of std 1: JS far from saturating at log 2
    lengths = torch.randint(1, L + 1, (G,), generator=g)
    lengths[:2] = L
    live = (torch.arange(L)[None] < lengths[:, None]).float()
    return hidden, weight, live, g


# On an Intel Xeon (AVX-512), under each ATEN_CPU_CAPABILITY: before the fix (8, 9, 4) and (4, 9, 4)
# moved with T (the last chunk, a [G, 1, H] strided view or part of [G, 4, H], by the batch's T); with
# the copy but chunks to the batch's T, (2, 9, 4) moves ([2, 1, H] and [2, 2, H] take other matrix
# kernels); with the extent but no copy, (4, 2, 4) moves (alone its chunk is the whole contiguous tensor)
@pytest.mark.parametrize(("G", "L", "chunk"), [(8, 9, 4), (4, 9, 4), (2, 9, 4), (4, 2, 4), (4, 6, 1)])
@pytest.mark.parametrize("seed", range(3))
def test_a_groups_js_is_the_same_in_every_batch_around_it(G, L, chunk, seed):
    hidden, weight, live, g = _group(G, L, seed)

    def project(h):
        return F.linear(h, weight)

    alone = chunked_js_to_group_mean(hidden, project, torch.zeros(G, dtype=torch.long), live, chunk_positions=chunk)
    assert (alone[:2] > 0).all()
    for T, before in itertools.product((L + 1, L + 3, 2 * L), (0, 3)):
        h = torch.randn(before + G, T, H, generator=g) * 100  # other rows, and garbage in the padding
        h[before:, :L] = hidden
        lv = torch.zeros(before + G, T)
        lv[before:, :L] = live
        group = torch.cat([torch.full((before,), 7), torch.zeros(G, dtype=torch.long)])
        got = chunked_js_to_group_mean(h, project, group, lv, chunk_positions=chunk)
        assert torch.equal(got[before:, :L], alone), (T, before)
        assert (got[before:, L:] == 0).all()
