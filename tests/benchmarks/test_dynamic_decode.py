"""``benchmarks/bench_dynamic_decode.py --longrope-only`` on a tiny Llama, both ways of pairing the rows.

With ``--interleave steps`` the rows' decoding steps alternate one by one on twins of the model that
share its weights; the rows and the schema are those of ``--interleave rounds``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from result_schema import read_rows  # noqa: E402  (benchmarks/ is not a package)

TINY = ["--hidden", "64", "--heads", "2", "--kv-heads", "1", "--layers", "1", "--vocab", "128"]


@pytest.mark.parametrize("interleave", ["rounds", "steps"])
def test_longrope_rows_of_both_pairings(tmp_path, interleave):
    out = tmp_path / "decode.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_dynamic_decode.py"),
            "--longrope-only",
            *TINY,
            "--original-length",
            "32",
            "--new-tokens",
            "8",
            "--repeats",
            "2",
            "--interleave",
            interleave,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [r for r in read_rows(out) if r.benchmark == "dynamic_decode_longrope"]
    ratios = {
        (r.setting["scenario"], r.method, r.setting.get("exact_cache"), r.setting["keep_first"]): r.value
        for r in rows
        if r.metric == "decode_ratio_vs_plain"
    }
    assert len(ratios) == 8 and {r.setting["interleave"] for r in rows} == {interleave}
    for scenario in ("across the switch", "past the switch"):
        assert ratios[scenario, "none", None, 0] == 1.0
        assert all(value > 0 for value in ratios.values())
    assert all(len(r.extra["round_seconds"]) == 2 for r in rows)
