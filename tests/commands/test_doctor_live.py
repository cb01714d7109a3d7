"""``hf-posext doctor --live PATH``: the model loaded and hf_posext.verify run on it (issue 57, item 5)."""

from __future__ import annotations

import json

import pytest
import torch
from tests.helpers.models import tiny_model

import hf_posext
from hf_posext.commands.main import main


@pytest.fixture
def patched(tmp_path):
    folder = tmp_path / "yarn"
    hf_posext.patch_model(tiny_model(), "yarn", factor=4).save_pretrained(folder)
    return folder


def test_a_model_that_runs_its_config_is_one_line_and_exit_0(patched, capsys):
    assert main(["doctor", "--live", str(patched)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"{patched}: the loaded model runs its config (1 rotary: model.rotary_emb)"]
    assert main(["doctor", "--live", str(patched), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {"path": str(patched), "rotary_modules": ["model.rotary_emb"], "mismatches": []}


def test_each_mismatch_is_one_line_and_exit_1(patched, capsys, monkeypatch):
    """A loader that leaves the frequencies of the plain model (what another program's loader may do)."""
    load = hf_posext.loading.from_pretrained

    def plain_frequencies(*args, **kwargs):
        model = load(*args, **kwargs)
        with torch.no_grad():
            model.model.rotary_emb.inv_freq.copy_(tiny_model().model.rotary_emb.inv_freq)
        return model

    monkeypatch.setattr("hf_posext.loading.from_pretrained", plain_frequencies)
    assert main(["doctor", "--live", str(patched)]) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"{patched}: model.rotary_emb: inv_freq: the config says [") and "(yarn)" in line
    assert main(["doctor", "--live", str(patched), "--json"]) == 1
    (mismatch,) = json.loads(capsys.readouterr().out)["mismatches"]
    assert mismatch["module"] == "model.rotary_emb" and mismatch["field"] == "inv_freq"


def test_a_path_that_cannot_be_loaded_is_one_line_and_exit_2(tmp_path, capsys):
    for path in (tmp_path / "missing", tmp_path):
        assert main(["doctor", "--live", str(path)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0]


def test_a_patched_gguf_loads_as_a_model_that_runs_its_config(tmp_path, capsys, monkeypatch):
    """Item 4 and 5 together: the rope keys of a GGUF hf-posext wrote are what the loaded model runs."""
    pytest.importorskip("gguf")
    from tests.helpers.gguf_files import write_model_gguf

    from hf_posext.publish.gguf_patch import patch_gguf

    monkeypatch.setenv("HF_POSEXT_CACHE", str(tmp_path / "cache"))
    source = write_model_gguf(tmp_path / "src.gguf", tiny_model(tie_word_embeddings=False))
    out = patch_gguf(source, tmp_path / "yarn.gguf", "yarn", factor=4)
    assert main(["doctor", "--live", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mismatches"] == []
    assert hf_posext.from_pretrained(out).config.rope_parameters["rope_type"] == "yarn"
