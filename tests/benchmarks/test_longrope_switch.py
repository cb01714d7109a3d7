"""``benchmarks/bench_longrope_switch.py`` on a tiny Llama: the rows of each cache, ratios against transformers'."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from result_schema import read_rows  # noqa: E402  (benchmarks/ is not a package)

TINY = ["--hidden", "64", "--heads", "2", "--kv-heads", "1", "--layers", "2", "--vocab", "128"]


def run(out, *args):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_longrope_switch.py"), *TINY, *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [r for r in read_rows(out) if r.benchmark == "longrope_switch"]


def test_rows_of_each_cache_against_transformers(tmp_path):
    out = tmp_path / "switch.json"
    rows = run(out, "--original-length", "32", "--steps", "3", "--repeats", "2")
    values = {(r.setting["cache"], r.metric): r for r in rows}
    for cache in ("transformers", "recompute", "per_query"):
        for metric in ("crossing_ratio_vs_transformers", "steady_ratio_vs_transformers"):
            assert values[cache, metric].unit == "x" and values[cache, metric].value > 0
        assert len(values[cache, "crossing_step_s"].extra["round_crossing_s"]) == 2
    assert values["transformers", "crossing_ratio_vs_transformers"].value == 1.0
    assert values["transformers", "prefill_s"].value > 0
    # a run of another shape keeps these rows
    assert len(run(out, "--original-length", "16", "--steps", "2", "--repeats", "1")) == 2 * len(rows)
