"""Result files: the resume helper shared by ``hf-posext eval`` and the reproduction."""

from __future__ import annotations

import json

import pytest

from hf_posext.eval.report import ResultFile


def test_results_are_saved_at_once_and_reused_only_with_the_same_settings(tmp_path):
    path = tmp_path / "out" / "ppl.json"
    calls = []

    def compute(value):
        calls.append(value)
        return {"value": value}

    first = ResultFile(path, {"lengths": (128, 256), "factor": 4.0})
    assert first.get("yarn", lambda: compute(1)) == {"value": 1}
    saved = json.loads(path.read_text())
    assert saved["results"] == {"yarn": {"value": 1}} and saved["settings"] == {"lengths": [128, 256], "factor": 4.0}
    assert "environment" in saved and saved["seconds"] >= 0

    # The same settings (a tuple reads back as a list): the result is read, not computed again.
    again = ResultFile(path, {"lengths": (128, 256), "factor": 4.0})
    assert "yarn" in again and again.get("yarn", lambda: compute(2)) == {"value": 1} and calls == [1]
    # Another setting would replace the results: refused, naming the file and the setting, unless overwrite.
    with pytest.raises(ValueError, match=r"ppl.json.* other settings \(factor 4.0 -> 8.0\).*--overwrite"):
        ResultFile(path, {"lengths": (128, 256), "factor": 8.0})
    assert json.loads(path.read_text())["results"] == {"yarn": {"value": 1}}
    other = ResultFile(path, {"lengths": (128, 256), "factor": 8.0}, overwrite=True)
    assert "yarn" not in other and other.get("yarn", lambda: compute(3)) == {"value": 3} and calls == [1, 3]


def test_markdown_table_without_rows_is_its_header():
    from hf_posext.eval.report import markdown_table

    assert markdown_table(["length", "p"], []) == "| length | p |\n|--------|---|"
