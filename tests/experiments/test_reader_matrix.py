"""doctor's verdicts are the reader matrix's (issue 57, item 2): benchmarks/results/reader_matrix.json, measured by
running each reader (hf_posext/experiments/reader_matrix.py), against ``hf-posext doctor`` on the same saved configs.

The quick test compares doctor with the committed cells; the integration test runs the readers again
(transformers 5 without and with hf_posext, hf_posext.from_pretrained, transformers 4.57 in its side
environment) and checks that the committed matrix is what they do today; another runs llama.cpp and the
export again on a few rows (`GGUF_ROWS`: all rows cost ~8 minutes of conversion, `benchmarks/reader_matrix.py`).
"""

from __future__ import annotations

import json

import pytest
from tests.helpers import ROOT

from hf_posext.commands.doctor import diagnose_path
from hf_posext.experiments import reader_matrix as matrix

RESULTS = ROOT / "benchmarks" / "results" / "reader_matrix.json"
#: The matrix's reader -> doctor's reader and route (hf_posext.from_pretrained on a folder is transformers 5 after
#: the import; on the exported GGUF it reads what the export wrote, as llama.cpp does).
DOCTOR_KEY = {
    "transformers5": ("transformers5", None),
    "transformers5_hf_posext": ("transformers5_hf_posext", None),
    "hf_posext": ("transformers5_hf_posext", None),
    "transformers4": ("transformers4", None),
    "llamacpp_converter": ("llamacpp", "converter"),
    "llamacpp": ("llamacpp", "gguf_export"),
    "hf_posext_gguf": ("llamacpp", "gguf_export"),
}


def doctor_said(readers: dict, reader: str) -> dict:
    key, route = DOCTOR_KEY[reader]
    return readers[key] if route is None else readers[key]["routes"][route]


def committed() -> dict[tuple[str, str], str]:
    cells = [row for row in json.loads(RESULTS.read_text()) if row["benchmark"] == "reader_matrix"]
    return {(row["method"], row["setting"]["reader"]): row["value"] for row in cells}


def measured_readers(row: matrix.Row) -> list[str]:
    """The readers a row is measured in: all, but llama.cpp's converter only on :data:`matrix.GGUF_MODEL_TYPES`."""
    off_graph = row.model_type not in matrix.GGUF_MODEL_TYPES
    return [reader for reader in matrix.READERS if not (off_graph and reader == "llamacpp_converter")]


def test_every_row_of_the_matrix_is_measured_in_every_reader():
    cells = committed()
    assert set(cells) == {(row.name, reader) for row in matrix.rows() for reader in measured_readers(row)}
    assert set(cells.values()) <= set(matrix.VERDICTS)


@pytest.mark.parametrize("row", matrix.rows(), ids=lambda row: row.name)
def test_doctor_says_what_the_matrix_measured(tmp_path, row):
    matrix.write_row(row, tmp_path)
    readers = diagnose_path(str(tmp_path))["readers"]
    cells = committed()
    said = {reader: doctor_said(readers, reader)["verdict"] for reader in measured_readers(row)}
    measured = {reader: cells[(row.name, reader)] for reader in measured_readers(row)}
    for reader in set(matrix.GGUF_READERS) & set(said):  # doctor's llama.cpp rules cover the llama and qwen graphs
        if said[reader] == "unknown" and row.model_type not in matrix.GGUF_MODEL_TYPES:
            said[reader] = measured[reader]
    assert said == measured, {r: doctor_said(readers, r)["why"] for r in said if said[r] != measured[r]}


@pytest.mark.slow
@pytest.mark.integration  # transformers 4.57's side environment (scripts/transformers4_env.py)
def test_the_committed_matrix_is_what_the_readers_do_today(tmp_path):
    from scripts.transformers4_env import transformers4_python

    pythons = {"transformers5": None, "transformers5_hf_posext": None, "hf_posext": None}
    cells, _ = matrix.measure(tmp_path, {**pythons, "transformers4": transformers4_python()})
    expected = {key: verdict for key, verdict in committed().items() if key[1] not in matrix.GGUF_READERS}
    assert {(c["row"], c["reader"]): c["verdict"] for c in cells} == expected


#: The rows whose GGUF columns CI measures again (each costs ~10 s of conversion): the ropes llama.cpp reads, the
#: ones only the export writes, and one it refuses.
GGUF_ROWS = {
    "`yarn`",
    "`yarn`, `attention_factor=1.2`",
    "`linear`",
    "`rope_type: llama3`",
    "`longrope`",
    "`self_extend`",
    "Qwen3, `yarn`",  # the qwen3 graph; hf_posext.from_pretrained built it with transformers' default head_dim before
}


@pytest.mark.slow
@pytest.mark.integration  # llama.cpp compiled from llama-cpp-python's sdist (scripts/llamacpp_env.py)
def test_the_committed_gguf_columns_are_what_llamacpp_does_today(tmp_path):
    import sys

    from scripts.llamacpp_env import llamacpp_logits_files, llamacpp_python, llamacpp_source

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from llamacpp_gguf import tokenizer_dir

    assert {row.name for row in matrix.rows()} >= GGUF_ROWS
    converter = llamacpp_source() / "convert_hf_to_gguf.py"
    tools = matrix.GgufTools(converter, llamacpp_python(), tokenizer_dir(), llamacpp_logits_files)
    cells = matrix.measure_gguf(tmp_path, tools, GGUF_ROWS)
    expected = {key: verdict for key, verdict in committed().items() if key[0] in GGUF_ROWS}
    assert {(c["row"], c["reader"]): c["verdict"] for c in cells} == {
        key: verdict for key, verdict in expected.items() if key[1] in matrix.GGUF_READERS
    }
