"""Atomic writes: a failed or interrupted write never loses the previous file or folder."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

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


def _usual_mode() -> int:
    """What ``open(path, "w")`` gives a new file: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_get_the_mode_a_plain_open_gives(tmp_path, umask):
    """A writer that creates its file 0600 (safetensors' own temporary file) still yields a usual file."""
    old = os.umask(umask)
    try:
        with atomic_file(tmp_path / "one.bin") as tmp:
            tmp.write_bytes(b"x")
            tmp.chmod(0o600)
        with atomic_directory(tmp_path / "folder") as staged:
            (staged / "model.safetensors").write_bytes(b"x")
            (staged / "model.safetensors").chmod(0o600)
            (staged / "sub").mkdir()
            (staged / "sub" / "deep.txt").write_text("x")
            (staged / "sub" / "deep.txt").chmod(0o600)
        expected = _usual_mode()
    finally:
        os.umask(old)
    for path in (
        tmp_path / "one.bin",
        tmp_path / "folder" / "model.safetensors",
        tmp_path / "folder" / "sub" / "deep.txt",
    ):
        assert stat.S_IMODE(path.stat().st_mode) == expected, path


def test_a_killed_file_write_leaves_a_temporary_the_next_write_removes(tmp_path):
    """``.NAME.PID.tmp`` of a dead process goes; a live process's stays (it may still be writing)."""
    target = tmp_path / "out.gguf"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out.gguf.{int(dead.stdout)}.tmp"
    stale.write_bytes(b"x" * 1000)
    live = tmp_path / f".out.gguf.{os.getppid()}.tmp"
    live.write_bytes(b"y")
    other = tmp_path / f".other.gguf.{int(dead.stdout)}.tmp"
    other.write_bytes(b"z")
    write_text(target, "new")
    assert not stale.exists()
    assert live.exists() and other.exists()  # a live writer's file; another output's file
