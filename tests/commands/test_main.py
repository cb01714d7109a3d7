"""``hf-posext patch`` and the command-line error policy on bad input (issue 13, cases 11 and 13)."""

from __future__ import annotations

import json

import pytest
from models import tiny_model

from hf_posext.commands.main import main

L_ORIG = 64


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "base"
    tiny_model(max_positions=L_ORIG).save_pretrained(path)
    return path


@pytest.mark.parametrize("method", ["alibi", "sinusoidal", "learned"])
def test_patch_takes_no_factor_for_methods_without_one(base, tmp_path, method):
    assert main(["patch", str(base), str(tmp_path / "out"), "--method", method]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["hf_posext"]["method"] == method


@pytest.mark.parametrize("method", ["yarn", "dynamic", "pi"])
def test_patch_needs_a_factor_for_methods_that_scale_rope(base, tmp_path, capsys, method):
    assert main(["patch", str(base), str(tmp_path / "out"), "--method", method]) == 2
    assert f"--method {method} needs --factor" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_patch_of_a_config_file_asks_for_its_folder(base, tmp_path, capsys):
    assert main(["patch", str(base / "config.json"), str(tmp_path / "out"), "--method", "yarn", "--factor", "2"]) == 2
    assert f"pass the checkpoint folder that holds it ({base})" in one_line_error(capsys)


def test_patch_refuses_factor_in_set(base, tmp_path, capsys):
    assert main(["patch", str(base), str(tmp_path / "out"), "--method", "yarn", "--factor", "2",
                 "--set", "factor=8"]) == 2
    assert "factor has its own flag, use --factor 8" in one_line_error(capsys)


def test_patch_refuses_a_factor_beyond_any_context(base, tmp_path, capsys):
    assert main(["patch", str(base), str(tmp_path / "out"), "--method", "yarn", "--factor", "1e308"]) == 2
    assert "factor=1e+308 times the original context 64" in one_line_error(capsys)


def test_an_invalid_config_json_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", ')
    argv = ["patch", str(broken), str(tmp_path / "out"), "--method", "yarn", "--factor", "2"]
    assert main(argv) == 2
    assert str(broken / "config.json") in one_line_error(capsys)
    with pytest.raises(OSError):  # the traceback on request
        main(["--debug", *argv])
    monkeypatch.setenv("HF_POSEXT_DEBUG", "1")
    with pytest.raises(OSError):
        main(argv)
