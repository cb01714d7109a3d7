"""Atomic writes: a failed or interrupted write never loses the previous file or folder."""

from __future__ import annotations

import pytest

from hf_posext.files import MARKER, atomic_directory, atomic_file, write_marker, write_text


def test_success_replaces_the_folder_in_one_piece(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("one")
    with atomic_directory(target) as tmp:
        (tmp / "b.txt").write_text("two")
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "b.txt"]  # the completion marker, written last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary or old folders left


def test_an_exception_inside_leaves_the_previous_folder(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("one")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_directory(target) as tmp:
            (tmp / "half.txt").write_text("half")
            raise RuntimeError("disk full")
    assert (target / "a.txt").read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_crash_between_the_two_renames_is_recovered(tmp_path):
    """The state a kill between ``target -> .old`` and ``tmp -> target`` leaves behind: a complete folder."""
    orphan = tmp_path / ".ckpt.old-4242"
    orphan.mkdir()
    (orphan / "a.txt").write_text("previous")
    write_marker(orphan)
    with pytest.raises(RuntimeError):
        with atomic_directory(tmp_path / "ckpt"):
            raise RuntimeError("killed again")
    assert (tmp_path / "ckpt" / "a.txt").read_text() == "previous"
    assert not orphan.exists()


def test_a_failed_file_write_leaves_the_previous_file(tmp_path):
    target = tmp_path / "results.json"
    write_text(target, "old")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_file(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    write_text(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
