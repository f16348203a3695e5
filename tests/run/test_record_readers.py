"""The fast readers `stare-lab claims` uses (record.read_metric_values, record.problem_counts) give what the
general readers give: scan_metrics' rows, and per-problem counts by pandas, on awkward files."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from stare_lab.record import append_metrics, problem_counts, read_metric_values, scan_metrics


def test_read_metric_values_equals_scan_metrics(tmp_path):
    rows = [
        {"step": 1, "time": 1.0, "entropy": 0.5, "tokens/entropy_selected": 9.0, "geometry/cosine": None},
        {"step": 2, "time": 2.0, "tokens/entropy_selected": 8.0, "flag": True},  # no entropy this step
        {"step": 3, "entropy": -1.5e-05, "geometry/cosine": 0.25, "note": "entropy"},
        {"time": 4.0, "step": 4, "entropy": 2.0},  # another key order
    ]
    for row in rows:
        append_metrics(tmp_path, row)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "entropy": 3.')  # a crash mid-write
    names = ["entropy", "geometry/cosine", "flag", "note"]
    fast = read_metric_values(tmp_path, names)
    slow, bad = scan_metrics(tmp_path)
    assert [n for n, _ in bad] == [5]
    for name in names:
        expected = [
            (r["step"], math.nan if r[name] is None else float(r[name]))
            for r in slow
            if name in r and (r[name] is None or (isinstance(r[name], (int, float)) and not isinstance(r[name], bool)))
        ]
        assert len(fast[name]) == len(expected), name
        for (s1, v1), (s2, v2) in zip(fast[name], expected, strict=True):
            assert s1 == s2 and (v1 == v2 or (math.isnan(v1) and math.isnan(v2))), (name, s1, v1, v2)
    assert fast["entropy"] == [(1, 0.5), (3, -1.5e-05), (4, 2.0)]
    assert fast["flag"] == [] and fast["note"] == []


def test_problem_counts_equal_a_pandas_count_and_mark_unjudged_problems(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.choice([f"p{i}" for i in range(7)], 200)
    correct = rng.random(200) < 0.4
    column = pa.array(
        [None if (i == "p3" and k % 5 == 0) else bool(c) for k, (i, c) in enumerate(zip(ids, correct, strict=True))]
    )
    path = tmp_path / "s.parquet"
    # two row groups, so the dictionaries of the problem ids must be unified
    pq.write_table(pa.table({"problem_id": ids, "correct": column}), path, row_group_size=64)
    got_ids, got_c, got_n = problem_counts(path)
    frame = pd.DataFrame({"problem": ids, "correct": column.to_pandas()})
    expected = frame.groupby("problem")["correct"].agg(["sum", "size"])
    got = pd.DataFrame({"sum": got_c, "size": got_n}, index=got_ids).sort_index()
    assert list(got.index) == list(expected.index)
    np.testing.assert_array_equal(got["size"], expected["size"])
    unjudged = frame.groupby("problem")["correct"].apply(lambda c: c.isna().any())
    assert list(unjudged[unjudged].index) == ["p3"] and math.isnan(got.loc["p3", "sum"])
    np.testing.assert_array_equal(got["sum"].drop("p3"), expected["sum"].drop("p3").astype(float))
    assert json.dumps(sorted(got_ids.tolist())) == json.dumps(sorted(set(ids)))
