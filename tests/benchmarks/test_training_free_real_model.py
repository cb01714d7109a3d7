"""The training-free table's report: no model is loaded, it reads a cell file."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmark imports its siblings from there

import training_free_real_model as training_free  # noqa: E402


def test_the_report_has_a_column_for_every_length_with_passkey_cells(tmp_path):
    cells = training_free.Cells(tmp_path / "results.json", {"dtype": "bfloat16"})
    cells.cells = {
        "passkey/yarn s=4/8192/0.0": {"value": True},
        "passkey/yarn s=4/8192/0.111": {"value": False},
        "passkey/yarn s=4/32768/0.0": {"value": True},
    }
    text = training_free.report(cells, [16384], out=tmp_path)  # a --report run with the default lengths
    header = next(line for line in text.splitlines() if line.startswith("| method "))
    assert [c.strip() for c in header.strip("|").split("|")] == ["method", "8k", "16k", "32k"]
    row = next(line for line in text.splitlines() if line.startswith("| yarn s=4 "))
    assert [c.strip() for c in row.strip("|").split("|")][1:3] == ["1/2 (0.09-0.91)", "-"]
    assert (tmp_path / "real_model.md").read_text() == text
