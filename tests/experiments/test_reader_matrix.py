"""doctor's verdicts are the reader matrix's (issue 57, item 2): benchmarks/results/reader_matrix.json, measured by
running each reader (hf_posext/experiments/reader_matrix.py), against ``hf-posext doctor`` on the same saved configs.

The quick test compares doctor with the committed cells; the integration test runs the readers again
(transformers 5 without and with hf_posext, hf_posext.from_pretrained, transformers 4.57 in its side
environment) and checks that the committed matrix is what they do today.
"""

from __future__ import annotations

import json

import pytest
from tests.helpers import ROOT

from hf_posext.commands.doctor import diagnose_path
from hf_posext.experiments import reader_matrix as matrix

RESULTS = ROOT / "benchmarks" / "results" / "reader_matrix.json"
#: The matrix's reader -> doctor's (hf_posext.from_pretrained on a folder is transformers 5 after the import).
DOCTOR_KEY = {
    "transformers5": "transformers5",
    "transformers5_hf_posext": "transformers5_hf_posext",
    "hf_posext": "transformers5_hf_posext",
    "transformers4": "transformers4",
}


def committed() -> dict[tuple[str, str], str]:
    cells = [row for row in json.loads(RESULTS.read_text()) if row["benchmark"] == "reader_matrix"]
    return {(row["method"], row["setting"]["reader"]): row["value"] for row in cells}


def test_every_row_of_the_matrix_is_measured_in_every_reader():
    cells = committed()
    assert {name for name, _ in cells} == {row.name for row in matrix.rows()}
    assert {reader for _, reader in cells} == set(matrix.READERS)
    assert set(cells.values()) <= set(matrix.VERDICTS)


@pytest.mark.parametrize("row", matrix.rows(), ids=lambda row: row.name)
def test_doctor_says_what_the_matrix_measured(tmp_path, row):
    matrix.write_row(row, tmp_path)
    readers = diagnose_path(str(tmp_path))["readers"]
    cells = committed()
    said = {reader: readers[DOCTOR_KEY[reader]]["verdict"] for reader in matrix.READERS}
    measured = {reader: cells[(row.name, reader)] for reader in matrix.READERS}
    assert said == measured, {r: readers[DOCTOR_KEY[r]]["why"] for r in said if said[r] != measured[r]}


@pytest.mark.slow
@pytest.mark.integration  # transformers 4.57's side environment (tests/helpers/transformers4_env.py)
def test_the_committed_matrix_is_what_the_readers_do_today(tmp_path):
    from tests.helpers.transformers4_env import transformers4_python

    pythons = {"transformers5": None, "transformers5_hf_posext": None, "hf_posext": None}
    cells, _ = matrix.measure(tmp_path, {**pythons, "transformers4": transformers4_python()})
    assert {(c["row"], c["reader"]): c["verdict"] for c in cells} == committed()
