"""Output files: nothing lost, nothing half-done (one test per way a write can go wrong).

A mount point as OUT (simulated: renaming onto or away from OUT raises EBUSY, as the kernel does
for a mount point), an existing OUT, OUT == SRC or inside SRC, OUT a file or a symlink, SIGKILL
during a write and during cleanup (real subprocesses), resume from a broken training state, what
``hf-posext push`` sends and the folders' permissions.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from huggingface_hub.utils import filter_repo_objects

from hf_posext.commands.main import main as cli_main
from hf_posext.files import MARKER, atomic_directory
from hf_posext.publish.hub import push_to_hub
from hf_posext.train import loop
from hf_posext.train.saved_state import latest_checkpoint, load_checkpoint
from hf_posext.train.config import TrainConfig
from tests.helpers.finetune import train_config
from hf_posext.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

pytestmark = pytest.mark.usefixtures("one_thread")


def run_config(assets: Path, output_dir: Path, **overrides) -> TrainConfig:
    return train_config(
        assets, output_dir, **{"warmup_steps": 0, "activation_checkpointing": False, "seed": 3, **overrides}
    )


def patch(src: Path, out: Path, *extra: str) -> int:
    return cli_main(["patch", str(src), str(out), "--method", "yarn", "--factor", "2", *extra])


def mount_point(monkeypatch, out: Path) -> None:
    """Simulates a mount point at ``out``: renaming a folder onto it or away from it raises EBUSY."""
    rename, replace = os.rename, os.replace

    def busy(real):
        def call(src, dst, *args, **kwargs):
            if Path(src) == out or Path(dst) == out:
                raise OSError(errno.EBUSY, "Device or resource busy", str(dst))
            return real(src, dst, *args, **kwargs)

        return call

    monkeypatch.setattr(os, "rename", busy(rename))
    monkeypatch.setattr(os, "replace", busy(replace))


def hidden_leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name or ".old-" in p.name)


# -- 1: a mount point as OUT ------------------------------------------------------------------------


def test_1_patch_writes_into_a_mount_point_in_place(finetune_assets, tmp_path, monkeypatch):
    out = tmp_path / "mnt"
    out.mkdir()  # a mount point always exists
    mount_point(monkeypatch, out)
    assert patch(finetune_assets / "llama", out) == 0
    assert (out / "model.safetensors").read_bytes() == (finetune_assets / "llama" / "model.safetensors").read_bytes()
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_type"] == "yarn"
    assert (out / MARKER).exists() and hidden_leftovers(out) == [] and hidden_leftovers(tmp_path) == []


def test_1_the_recipe_saves_into_a_mount_point_and_never_loses_a_finished_run(finetune_assets, tmp_path, monkeypatch):
    out = tmp_path / "mnt"
    out.mkdir()
    mount_point(monkeypatch, out)
    result = train(run_config(finetune_assets, out))
    assert result.output_dir == out and (out / "model.safetensors").exists() and (out / MARKER).exists()
    assert file_modes(out) == {0o666 & ~current_umask()}  # safetensors' own temporary file is 0600

    # A move that fails for another reason (disk full): the finished checkpoint stays, the error says where.
    full = tmp_path / "full"
    replace = os.replace

    def no_space(src, dst, *args, **kwargs):
        if full in Path(dst).parents or Path(dst) == full:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError, match="it is complete and kept in") as raised:
        train(run_config(finetune_assets, full))
    kept = Path(str(raised.value).split("kept in ")[1].strip("'"))
    assert (kept / "model.safetensors").stat().st_size > 0 and (kept / "train_results.json").exists()


# -- 2: an existing OUT -----------------------------------------------------------------------------


def test_2_a_non_empty_out_is_refused_unless_overwrite_and_keeps_what_is_not_ours(
    finetune_assets, tmp_path, capsys, caplog
):
    out = tmp_path / "out"
    (out / "notes").mkdir(parents=True)
    for name in ("notes/todo.txt", ".env", "results.csv", "model-00001-of-00002.safetensors"):
        (out / name).write_text("mine")
    assert patch(finetune_assets / "llama", out) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "--overwrite" in err
    assert sorted(p.name for p in out.iterdir()) == [".env", "model-00001-of-00002.safetensors", "notes", "results.csv"]
    with caplog.at_level(logging.WARNING, logger="hf_posext"):
        assert patch(finetune_assets / "llama", out, "--overwrite") == 0
    # Ours replaced (and a stale shard of ours removed, by name); everything else kept as it was.
    assert (out / "model.safetensors").read_bytes() == (finetune_assets / "llama" / "model.safetensors").read_bytes()
    assert not (out / "model-00001-of-00002.safetensors").exists()
    assert "model-00001-of-00002.safetensors" in caplog.text
    for name in ("notes/todo.txt", ".env", "results.csv"):
        assert (out / name).read_text() == "mine"


def test_2_what_overwrite_replaces_is_said_before_it_does(finetune_assets, tmp_path, capsys, caplog):
    """The user's own README.md would become the model card: the refusal says so, and so does the run."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    (out / "notes.txt").write_text("mine")
    assert patch(finetune_assets / "llama", out) == 2
    err = capsys.readouterr().err
    assert "--overwrite (overwrite=True) to replace README.md (this command writes them) and keep notes.txt" in err
    with caplog.at_level(logging.WARNING, logger="hf_posext"):
        assert patch(finetune_assets / "llama", out, "--overwrite") == 0
    assert "replacing README.md" in caplog.text and "notes.txt" not in caplog.text
    assert (out / "notes.txt").read_text() == "mine"


def test_2_the_recipe_refuses_a_non_empty_out_before_training(finetune_assets, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    trained = []
    monkeypatch.setattr(loop, "forward_loss", lambda *a, **k: trained.append(1))
    with pytest.raises(ValueError, match=r"thesis.tex.*--overwrite"):
        train(run_config(finetune_assets, out))
    assert trained == [] and (out / "thesis.tex").read_text() == "mine"

    # An earlier run's training states are not silently replaced by a new run's either.
    earlier = tmp_path / "fresh-checkpoints" / "step_00000002"
    earlier.mkdir(parents=True)
    with pytest.raises(ValueError, match=r"fresh-checkpoints.*step_00000002.*--overwrite"):
        train(run_config(finetune_assets, tmp_path / "fresh", checkpointing_steps=2))
    assert trained == [] and not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("where", ["same", "inside", "containing"])
def test_2_checkpoints_in_the_output_folder_are_refused_before_training(finetune_assets, tmp_path, monkeypatch, where):
    """The final save would refuse a folder holding ``step_*`` (or eat them): refused before the first step."""
    out = tmp_path / "out"
    checkpoints = {"same": out, "inside": out / "checkpoints", "containing": tmp_path}[where]
    trained = []
    monkeypatch.setattr(loop, "forward_loss", lambda *a, **k: trained.append(1))
    with pytest.raises(ValueError, match=r"--checkpoint-dir .* --output-dir"):
        train(run_config(finetune_assets, out, checkpointing_steps=1, checkpoint_dir=str(checkpoints)))
    assert trained == [] and not out.exists()


# -- 3: OUT == SRC, OUT inside SRC ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["same", "inside"])
def test_3_out_equal_to_or_inside_the_source_is_refused(finetune_assets, tmp_path, capsys, where):
    src = tmp_path / "src"
    shutil.copytree(finetune_assets / "llama", src)
    (src / "README.md").write_text("my notes")
    (src / ".gitattributes").write_text("*.safetensors filter=lfs")
    (src / ".cache").mkdir()
    before = sorted(p.relative_to(src).as_posix() for p in src.rglob("*"))
    out = src if where == "same" else src / "extended"
    assert patch(src, out) == 2
    assert "the source" in capsys.readouterr().err
    assert sorted(p.relative_to(src).as_posix() for p in src.rglob("*")) == before
    assert (src / "README.md").read_text() == "my notes"


# -- 4: OUT a file, OUT a symlink -------------------------------------------------------------------


def test_4_out_a_file_is_refused_and_a_symlink_is_written_through(finetune_assets, tmp_path, capsys):
    file = tmp_path / "out.txt"
    file.write_text("keep me")
    assert patch(finetune_assets / "llama", file) == 2
    assert "is an existing file" in capsys.readouterr().err and file.read_text() == "keep me"

    real, link = tmp_path / "bucket", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real, target_is_directory=True)
    assert patch(finetune_assets / "llama", link) == 0
    assert link.is_symlink()
    assert (real / "model.safetensors").read_bytes() == (finetune_assets / "llama" / "model.safetensors").read_bytes()

    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "not-yet", target_is_directory=True)
    assert patch(finetune_assets / "llama", dangling) == 0
    assert dangling.is_symlink() and (tmp_path / "not-yet" / "config.json").exists()


# -- 10: SIGKILL during the write and during cleanup ------------------------------------------------

KILLED_WRITE = """
import os, signal, sys
from hf_posext.files import atomic_directory
with atomic_directory(sys.argv[1]) as tmp:
    (tmp / "model.safetensors").write_bytes(b"x" * 100_000)
    os.kill(os.getpid(), signal.SIGKILL)  # a real crash in the middle of the write
"""

KILLED_CLEANUP = """
import os, shutil, signal, sys
from pathlib import Path
from hf_posext.files import atomic_directory
rmtree = shutil.rmtree
def killed_rmtree(path, *args, **kwargs):
    if ".old-" in Path(path).name:  # deleting the previous folder: half of it goes, then a crash
        (Path(path) / "model.safetensors").unlink()
        os.kill(os.getpid(), signal.SIGKILL)
    return rmtree(path, *args, **kwargs)
shutil.rmtree = killed_rmtree
with atomic_directory(sys.argv[1]) as tmp:
    (tmp / "model.safetensors").write_bytes(b"new")
    (tmp / "config.json").write_text("{}")
"""


def test_10_a_kill_during_the_write_leaves_nothing_a_later_run_keeps(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITE, str(out)], env=SUBPROCESS_ENV, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert hidden_leftovers(tmp_path) != []  # what the kill left
    with atomic_directory(out) as tmp:  # a later run
        (tmp / "model.safetensors").write_bytes(b"ok")
        (tmp / "config.json").write_text("{}")
    assert hidden_leftovers(tmp_path) == [] and (out / "model.safetensors").read_bytes() == b"ok"


def test_10_a_kill_during_cleanup_is_never_restored(tmp_path):
    out = tmp_path / "out"
    with atomic_directory(out) as tmp:
        (tmp / "model.safetensors").write_bytes(b"old")
        (tmp / "config.json").write_text("{}")
    # Killed while deleting the previous folder: a partial ".out.old-PID" (config, no weights).
    done = subprocess.run(
        [sys.executable, "-c", KILLED_CLEANUP, str(out)], env=SUBPROCESS_ENV, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert (out / "model.safetensors").read_bytes() == b"new"
    shutil.rmtree(out)  # the user starts over; a later run fails
    with pytest.raises(RuntimeError):
        with atomic_directory(out):
            raise RuntimeError("a failed run")
    assert not out.exists(), "a partial earlier folder was restored as OUT"
    assert hidden_leftovers(tmp_path) == []


# -- 11: resume from a broken training state --------------------------------------------------------


@pytest.fixture(scope="module")
def states(finetune_assets, tmp_path_factory):
    """Training states of steps 2 and 4 of a real run."""
    root = tmp_path_factory.mktemp("states")
    train(
        run_config(finetune_assets, root / "model", max_train_steps=4, checkpointing_steps=2, checkpoints_total_limit=0)
    )
    return root / "model-checkpoints"


@pytest.mark.parametrize("damage", ["truncated model.safetensors", "truncated optimizer.bin", "empty step folder"])
def test_11_resume_falls_back_to_the_newest_state_that_verifies(states, tmp_path, caplog, damage):
    root = tmp_path / "checkpoints"
    shutil.copytree(states, root)
    if damage == "empty step folder":
        broken = root / "step_00000006"
        broken.mkdir()
    else:
        broken = root / "step_00000004"
        name = damage.split()[1]
        size = (broken / name).stat().st_size
        with open(broken / name, "r+b") as handle:
            handle.truncate(size // 2)
    with caplog.at_level(logging.WARNING, logger="hf_posext"):
        good = latest_checkpoint(root)
    expected = "step_00000004" if damage == "empty step folder" else "step_00000002"
    assert good.name == expected
    reason = "no completion marker" if damage == "empty step folder" else f"{damage.split()[1]} is"
    assert broken.name in caplog.text and reason in caplog.text
    with pytest.raises(FileNotFoundError, match=rf"cannot resume from .*{broken.name}.*{reason}.*{expected}"):
        load_checkpoint(None, broken)


def test_11_a_run_resumes_past_a_truncated_state(finetune_assets, states, tmp_path):
    root = tmp_path / "model-checkpoints"
    shutil.copytree(states, root)
    with open(root / "step_00000004" / "model.safetensors", "r+b") as handle:
        handle.truncate(100)
    result = train(run_config(finetune_assets, tmp_path / "model", max_train_steps=4, resume="latest"))
    assert result.steps == 4 and len(result.losses) == 4


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def file_modes(folder: Path) -> set[int]:
    return {stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_every_written_file_gets_the_mode_a_plain_open_gives(finetune_assets, tmp_path, umask):
    old_umask = os.umask(umask)
    try:
        assert cli_main(["tiny-model", str(tmp_path / "tiny")]) == 0
        assert patch(tmp_path / "tiny", tmp_path / "patched") == 0
    finally:
        os.umask(old_umask)
    assert file_modes(tmp_path / "tiny") == file_modes(tmp_path / "patched") == {0o666 & ~umask}


# -- 14: what push sends, and permissions -----------------------------------------------------------


def test_14_push_sends_only_a_model_repository_and_folders_get_the_umask(
    finetune_assets, tmp_path, monkeypatch, capsys
):
    old_umask = os.umask(0o022)
    try:
        assert patch(finetune_assets / "llama", tmp_path / "model") == 0
    finally:
        os.umask(old_umask)
    folder = tmp_path / "model"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755  # not tempfile.mkdtemp's 0700
    (folder / "secrets.txt").write_text("hf_abc")
    (folder / "analysis.ipynb").write_text("{}")

    # The Hub's servers are mocked: upload_folder records its arguments instead of sending.
    sent = {}
    monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kwargs: repo_id)
    monkeypatch.setattr(HfApi, "upload_folder", lambda api, **kwargs: sent.update(kwargs) or "commit")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    every = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())

    assert cli_main(["push", str(folder), "me/model"]) == 0
    printed = capsys.readouterr().out
    uploaded = sorted(
        filter_repo_objects(every, allow_patterns=sent["allow_patterns"], ignore_patterns=sent["ignore_patterns"])
    )
    assert "secrets.txt" not in uploaded and "analysis.ipynb" not in uploaded
    assert {"model.safetensors", "config.json", "README.md", "tokenizer.json"} <= set(uploaded)
    assert "left out" in printed and "secrets.txt" in printed and "analysis.ipynb" in printed

    result = push_to_hub(folder, "me/model", include=["*.ipynb"], dry_run=True)
    assert "analysis.ipynb" in result.files and "secrets.txt" not in result.files
    assert result.left_out == ["secrets.txt"]
    assert "secrets.txt" in push_to_hub(folder, "me/model", all_files=True, dry_run=True).files
