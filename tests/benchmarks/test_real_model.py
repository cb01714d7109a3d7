"""The real-model benchmark's bookkeeping: which cells a plan computes, and resuming them.

The benchmark's model path (GGUF -> checkpoint -> patched forward, ``--quick`` end to end) runs
in ``tests/gguf/test_source.py``, which reads the GGUF file once for its module.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmark imports its harness from there
_spec = importlib.util.spec_from_file_location("real_model_bench", ROOT / "benchmarks" / "real_model.py")
real_model = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = real_model  # dataclasses look their module up by name
_spec.loader.exec_module(real_model)

TRAINED = real_model.TRAINED


def test_up_to_the_trained_context_every_method_is_the_unpatched_cell():
    for length in (4096, 8192):
        keys = {
            real_model.cell_key("ppl", m, f, length)
            for name, m, f in real_model.variants(real_model.FULL, length)
            if not name.endswith("s=4") or name.startswith("dynamic")
        }
        assert keys == {f"ppl/none/{length}"}
    # The fixed factor still differs from the unpatched model below 8k.
    assert ("yarn s=4", "yarn", 4.0) in real_model.variants(real_model.FULL, 4096)


def test_past_the_trained_context_matched_and_fixed_factors_share_a_cell_only_when_equal():
    at_16k = real_model.variants(real_model.FULL, 2 * TRAINED)
    assert ("yarn s=L/8k", "yarn", 2.0) in at_16k and ("dynamic_yarn s=4", "dynamic_yarn", 4.0) in at_16k
    at_32k = {
        real_model.cell_key("ppl", m, f, 4 * TRAINED) for _, m, f in real_model.variants(real_model.FULL, 4 * TRAINED)
    }
    # none, linear, ntk, yarn (s = L/8k = 4 = the fixed factor), dynamic_ntk, dynamic_yarn
    assert len(at_32k) == 6


def test_forward_counts_follow_the_plan():
    # 4k: none + 3 fixed + fine-tuned; 16k: 9 perplexity cells + fine-tuned, and 3 depths x
    # (none, 3 matched static, 2 dynamic, fine-tuned) passkey prompts.
    assert real_model.forwards(real_model.FULL) == {4096: 5, 8192: 11, 16384: 31, 32768: 7}
    assert real_model.forwards(real_model.WITH_PASSKEY_4X)[32768] == 7 + 3 * 7


def test_settings_ignore_which_lengths_and_methods_run_but_not_what_a_cell_means():
    settings = real_model.cell_settings(real_model.FULL)
    assert real_model.cell_settings(real_model.WITH_PASSKEY_4X) == settings
    assert real_model.cell_settings(replace(real_model.FULL, static_methods=("yarn",))) == settings
    assert real_model.cell_settings(replace(real_model.FULL, score_last=1024)) != settings
    # The scored tokens end at the longest length: dropping 32k would move them.
    assert real_model.cell_settings(replace(real_model.FULL, lengths=(4096, 8192))) != settings


def test_cells_resume_and_a_changed_setting_starts_again(tmp_path):
    path = tmp_path / "results.json"
    calls = []
    cells = real_model.Cells(path, {"a": 1})
    assert cells.get("x", lambda: calls.append("x") or 1.5) == 1.5
    again = real_model.Cells(path, {"a": 1})
    assert again.get("x", lambda: calls.append("again") or 0.0) == 1.5
    assert calls == ["x"] and len(again.runs) == 2
    changed = real_model.Cells(path, {"a": 2})
    assert changed.get("x", lambda: calls.append("changed") or 2.5) == 2.5
    assert calls == ["x", "changed"] and len(changed.runs) == 1


def test_cells_of_rows_whose_definition_is_unchanged_survive_new_and_changed_rows(tmp_path):
    """Adding a method to a table (training_free_real_model) keeps the hours of cells the others took."""
    path = tmp_path / "results.json"
    cells = real_model.Cells(path, {"a": 1, "rows": {"none": None, "dca": {}}}, rows_key="rows")
    for key in ("passkey/none/8/0.5", "ppl/dca/8"):
        cells.get(key, lambda: 1.0)
    grown = real_model.Cells(path, {"a": 1, "rows": {"none": None, "dca": {"x": 2}, "string": {}}}, rows_key="rows")
    assert set(grown.cells) == {"passkey/none/8/0.5"} and len(grown.runs) == 2
    assert grown.get("ppl/string/8", lambda: 3.0) == 3.0
    assert real_model.json.loads(path.read_text())["settings"]["rows"]["string"] == {}
    changed = real_model.Cells(path, {"a": 2, "rows": {"none": None}}, rows_key="rows")
    assert changed.cells == {}


def test_processes_with_other_rows_share_one_file_and_keep_each_others_cells(tmp_path):
    """A newer script (one more row) running beside an older one: neither drops the other's cells."""
    path = tmp_path / "results.json"
    old = real_model.Cells(path, {"a": 1, "rows": {"none": None, "dca": {}}}, rows_key="rows")
    new = real_model.Cells(path, {"a": 1, "rows": {"none": None, "dca": {"x": 2}, "yarn": {}}}, rows_key="rows")
    old.get("passkey/none/8/0.5", lambda: True)
    new.get("ppl/yarn/8", lambda: 3.0)  # dca is defined otherwise here: the old process's dca cells go
    old.get("ppl/dca/8", lambda: 1.0)
    new.get("ppl/none/8", lambda: 2.0)
    saved = real_model.json.loads(path.read_text())
    assert set(saved["cells"]) == {"passkey/none/8/0.5", "ppl/yarn/8", "ppl/none/8"}
    assert saved["settings"]["rows"] == {"none": None, "dca": {"x": 2}, "yarn": {}}
    old.get("passkey/none/8/1.0", lambda: False)  # the old one keeps the new row and its cell
    saved = real_model.json.loads(path.read_text())
    assert {"ppl/yarn/8", "passkey/none/8/1.0", "ppl/dca/8"} <= set(saved["cells"])
    assert saved["settings"]["rows"]["yarn"] == {}


def test_estimate_fits_a_quadratic_cost():
    # t(L) = 1e-3 L + 1e-7 L^2 seconds, measured exactly: the fit gives back the plan's minutes.
    cost = lambda n: 1e-3 * n + 1e-7 * n * n  # noqa: E731
    minutes = real_model.estimate_minutes(real_model.FULL, {str(n): cost(n) for n in (2048, 4096, 8192)})
    assert minutes["32768"] == pytest.approx(round(7 * cost(32768) / 60, 1))
    assert minutes["16384"] == pytest.approx(round(31 * cost(16384) / 60, 1))


@pytest.mark.parametrize("argv", [["--upto", "100"], ["--quick", "--passkey-4x"], ["--threads", "0"]])
def test_bad_arguments_exit_with_a_message(argv, monkeypatch):
    monkeypatch.setattr(real_model, "run", lambda *a, **k: pytest.fail("ran"))
    monkeypatch.setattr(real_model, "gguf_file", lambda path: Path("unused.gguf"))
    with pytest.raises(SystemExit, match="real_model: "):
        real_model.main(argv)
