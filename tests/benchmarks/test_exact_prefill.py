"""``benchmarks/bench_exact_prefill.py`` on a tiny Llama: the rows it writes, and that its modes run what they say.

Each configuration is a child process; a budget of a few rows puts a call of rows sharing one frequency set
into several kernel calls, the ``whole`` row into one per layer and call, with logits that agree.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from result_schema import read_rows  # noqa: E402  (benchmarks/ is not a package)

_spec = importlib.util.spec_from_file_location("bench_exact_prefill", ROOT / "benchmarks" / "bench_exact_prefill.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

TINY = ["--hidden", "64", "--heads", "2", "--kv-heads", "1", "--layers", "2", "--vocab", "128", "--compare", "8"]


def test_blocks_whole_and_transformers_rows(tmp_path):
    out = tmp_path / "prefill.json"
    argv = [*TINY, "--original-length", "32", "--multiples", "8", "--budget", str(4 * 256), "--out", str(out)]
    assert bench.main(argv) == 0
    rows = {(r.method, r.metric): r.value for r in read_rows(out)}
    for method in ("longrope", "dynamic_yarn"):
        # 256 tokens, two layers, two calls each: the rows up to L_orig = 32, and LongRoPE's long rows
        # 32..256 (YaRN at factor 4: its saturated rows 128..256); 4 rows a block at 256 keys
        assert rows[f"{method} whole", "kernel_calls"] == 4
        assert rows[f"{method} blocks", "kernel_calls"] > 10 * 4
        assert rows[f"{method} blocks / whole", "max_logit_difference"] <= 1e-4
        for against in ("whole", "transformers"):
            expected = rows[f"{method} blocks", "prefill_s"] / rows[f"{method} {against}", "prefill_s"]
            assert rows[f"{method} blocks / {against}", "time_ratio"] == pytest.approx(expected)
