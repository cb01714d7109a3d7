"""``model_fingerprint``: keyed on the weights' bytes, so a model rewritten in place is another model."""

from __future__ import annotations

import os
import shutil

import pytest

from hf_posext import content_digest
from hf_posext.eval.evaluated_model import model_fingerprint
from hf_posext.testing import make_tiny_model


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_POSEXT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(content_digest, "_MEMO", {})
    return make_tiny_model(tmp_path / "tiny", hidden_size=32, max_position_embeddings=32)


def _flip_a_byte(path, *, in_place: bool) -> None:
    """Change one byte near the end of ``path``, keep its size and give it back its old times."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-5] ^= 1
    if in_place:  # same inode
        with path.open("r+b") as handle:
            handle.write(data)
    else:  # a new file renamed over it, as save_pretrained and cp do
        tmp = path.with_name(path.name + ".new")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns


@pytest.mark.parametrize("in_place", [True, False])
def test_weights_rewritten_with_the_same_size_and_time_are_another_model(folder, in_place):
    weights = folder / "model.safetensors"
    original = weights.read_bytes()
    before = model_fingerprint(str(folder))
    assert model_fingerprint(str(folder)) == before
    _flip_a_byte(weights, in_place=in_place)
    assert model_fingerprint(str(folder)) != before
    weights.write_bytes(original)  # the very bytes again, written at another time: the same model
    assert model_fingerprint(str(folder)) == before


def test_a_copied_or_moved_folder_is_the_same_model(folder, tmp_path):
    before = model_fingerprint(str(folder))
    copy = shutil.copytree(folder, tmp_path / "copy")  # new inodes and times
    assert model_fingerprint(str(copy)) == before
    moved = folder.rename(tmp_path / "moved")
    assert model_fingerprint(str(moved)) == before


def test_unchanged_weights_are_read_once_even_across_processes(folder, monkeypatch):
    """The digest is kept by (device, inode, size, mtime, ctime), in memory and in the cache folder."""
    reads = []
    real = content_digest._hash_file
    monkeypatch.setattr(content_digest, "_hash_file", lambda path, prefix: reads.append(path) or real(path, prefix))
    first = model_fingerprint(str(folder))
    hashed = len(reads)
    assert hashed >= 2  # the weights and the tokenizer, config.json by its bytes
    assert model_fingerprint(str(folder)) == first and len(reads) == hashed
    monkeypatch.setattr(content_digest, "_MEMO", {})  # a new process: only the cache file is left
    assert model_fingerprint(str(folder)) == first and len(reads) == hashed
    _flip_a_byte(folder / "model.safetensors", in_place=True)
    assert model_fingerprint(str(folder)) != first and len(reads) == hashed + 1
