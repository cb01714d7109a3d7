"""A GGUF that is not a whole model (no head counts, no layer tensors): one line naming the file and what it lacks.

Every way in reads it first (:func:`hf_posext.gguf.writer.check_model_keys`): ``patch`` to a GGUF or a folder,
``doctor``, ``eval`` and :func:`hf_posext.from_pretrained`; nothing is written, no conversion is cached.
"""

from __future__ import annotations

import pytest
from tests.helpers.gguf_files import write_tiny_gguf

import hf_posext
from hf_posext.commands.main import main

LACKS = {"heads": "llama.attention.head_count", "layers": "no tensors for layers [0]"}

WAYS_IN = {
    "patch to a GGUF": ["patch", "{gguf}", "{tmp}/out.gguf", "--method", "yarn", "--factor", "2"],
    "patch to a folder": ["patch", "{gguf}", "{tmp}/out", "--method", "yarn", "--factor", "2"],
    "doctor": ["doctor", "{gguf}"],
    "eval": ["eval", "passkey", "{gguf}", "--lengths", "32", "--out", "{tmp}/eval"],
}


@pytest.fixture
def incomplete(tmp_path, monkeypatch, request):
    monkeypatch.setenv("HF_POSEXT_CACHE", str(tmp_path / "cache"))
    missing = request.param
    return missing, write_tiny_gguf(tmp_path / f"no-{missing}.gguf", **{missing: False})


@pytest.mark.parametrize("incomplete", list(LACKS), indirect=True)
@pytest.mark.parametrize("way", list(WAYS_IN))
def test_every_command_refuses_it_in_one_line_writing_nothing(tmp_path, capsys, incomplete, way):
    missing, path = incomplete
    argv = [arg.format(gguf=path, tmp=tmp_path) for arg in WAYS_IN[way]]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and path.name in lines[0] and LACKS[missing] in lines[0], lines
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert written in ([path.name], ["cache", "cache/digests.json", path.name]), written  # eval's file-digest cache


@pytest.mark.parametrize("incomplete", list(LACKS), indirect=True)
def test_from_pretrained_refuses_it_naming_the_file(tmp_path, incomplete):
    missing, path = incomplete
    with pytest.raises(ValueError, match=LACKS[missing].replace("[", r"\[").replace("]", r"\]")) as error:
        hf_posext.from_pretrained(path)
    assert path.name in str(error.value)
    assert not (tmp_path / "cache").exists()


def test_a_folder_is_not_patched_into_a_file_named_gguf(tmp_path, capsys):
    assert main(["patch", str(tmp_path / "base"), str(tmp_path / "out.gguf"), "--method", "yarn", "--factor", "2"]) == 2
    line = capsys.readouterr().err.strip()
    assert "ends in .gguf" in line and "hf-posext gguf export" in line and len(line.splitlines()) == 1
    assert not (tmp_path / "out.gguf").exists()
