"""``hf-posext eval harness``'s bad input: one line, exit 2, before any model loads (lm-eval itself: tests/eval/)."""

from __future__ import annotations

import sys

import pytest

from hf_posext.commands.main import main


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_without_lm_eval_the_command_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    assert main(["eval", "harness", str(tmp_path), "--tasks", "hellaswag"]) == 2
    assert "needs the 'lm_eval' package: pip install 'hf-posext[harness]'" in one_line_error(capsys)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--tasks", " , "], "--tasks names no task"),
        (["--tasks", "x", "--method", "yarn"], "--method yarn needs --factor"),
        (["--tasks", "x", "--include-path", "no/such/dir"], "--include-path 'no/such/dir' is not a folder"),
        (["--tasks", "x", "--metadata", "[1]"], "--metadata must be a JSON object"),
        (["--tasks", "x", "--metadata", "{"], "--metadata must be a JSON object"),
        (["--tasks", "x", "--factor", "4"], "--factor applies to --method, which is not given"),
        (["--tasks", "x", "--set", "beta_fast=8"], "--set applies to --method, which is not given"),
        (["--tasks", "x", "--out", "{tmp}"], "is an existing folder"),
        (["--tasks", "x", "--out", "{tmp}/a_file/r.json"], "a_file"),
    ],
)
def test_bad_flags_are_one_line_before_any_model_loads(tmp_path, capsys, flags, words):
    pytest.importorskip("lm_eval")
    (tmp_path / "a_file").write_text("")
    flags = [flag.replace("{tmp}", str(tmp_path)) for flag in flags]
    assert main(["eval", "harness", str(tmp_path / "no-model"), *flags]) == 2
    assert words in one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written


def test_an_existing_out_file_is_kept(tmp_path, capsys):
    pytest.importorskip("lm_eval")
    (tmp_path / "r.json").write_text("{}")
    assert main(["eval", "harness", str(tmp_path / "no-model"), "--tasks", "x", "--out", str(tmp_path / "r.json")]) == 2
    assert "exists; pass --overwrite" in one_line_error(capsys) and (tmp_path / "r.json").read_text() == "{}"
