"""``hf-posext gguf export``: bad flags are one line naming the flag, before the converter runs."""

from __future__ import annotations

import pytest
from tests.helpers.models import tiny_model

from hf_posext.gguf import export as gguf_export
from hf_posext.commands.main import main


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    tiny_model(max_positions=64).save_pretrained(path)
    return path


@pytest.fixture
def no_converter(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the converter was looked for before --outtype was checked")

    monkeypatch.setattr(gguf_export, "find_converter", refuse)


def test_a_bad_outtype_is_one_line_naming_the_flag_and_its_values(checkpoint, tmp_path, capsys, no_converter):
    out = tmp_path / "out.gguf"
    assert main(["gguf", "export", str(checkpoint), str(out), "--outtype", "bogus"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert "--outtype must be one of f32, f16, bf16, q8_0, tq1_0, tq2_0, auto; got 'bogus'" in lines[0]
    assert not out.exists()


def test_the_library_refuses_a_bad_outtype_before_converting(checkpoint, tmp_path, no_converter):
    with pytest.raises(ValueError, match=r"outtype must be one of f32, f16, .*auto; got 'q4_0'"):
        gguf_export.export_gguf(checkpoint, tmp_path / "out.gguf", outtype="q4_0")
