"""``hf-posext push``: the exact files and model card that would reach the Hub.

No Hub is reachable here, so the two HfApi methods that talk to the servers (``create_repo``
and ``upload_folder``) are replaced by recorders: the only mocks in this file. Everything up to
that boundary is real, including huggingface_hub's own pattern filter (``filter_repo_objects``),
which shows what ``upload_folder`` would select with the patterns we pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.utils import filter_repo_objects

from hf_posext import patch_model
from hf_posext.commands.main import main
from hf_posext.publish.hub import push_to_hub
from hf_posext.publish import model_card
from hf_posext.testing import make_tiny_model

SECRET = "hf_secretTOKENforTESTSdoNOTprint1234"
CHECKPOINT_FILES = [
    "README.md",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "train_results.json",
]


@pytest.fixture()
def checkpoint(tmp_path):
    """A fine-tune output folder, plus the clutter a run leaves that must stay local."""
    folder = make_tiny_model(
        tmp_path / "model-yarn", hidden_size=32, num_heads=2, num_kv_heads=1, max_position_embeddings=32
    )
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    patch_model(config, "yarn", factor=4)
    config.save_pretrained(folder)
    model_card(config, base_model="my-org/tiny-base", extra={"steps": 400}).save(folder / "README.md")
    (folder / "train_results.json").write_text(json.dumps({"steps": 400}))
    for junk in (
        "step_00000050/model.safetensors",
        ".model.tmp-123/config.json",
        ".cache/blocks.npy",
        "__pycache__/x.pyc",
        "save.tmp",
        "model-checkpoints/step_00000002/optimizer.bin",
        "sub/.hidden/x.json",
        "sub/step_00000003/random_states_0.pkl",
        "model.safetensors.lock",
    ):
        (folder / junk).parent.mkdir(parents=True, exist_ok=True)
        (folder / junk).write_text("local only")
    return folder


class HubRecorder:
    """Stands in for the Hub servers: records what HfApi would send."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, dict]] = []
        recorder = self

        def create_repo(api, repo_id, **kwargs):
            recorder.calls.append(("create_repo", {"repo_id": repo_id, "token": api.token, **kwargs}))
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(api, **kwargs):
            recorder.calls.append(("upload_folder", {"token": api.token, **kwargs}))
            return "https://huggingface.co/commit/abc"

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)


def uploaded(folder: Path, upload: dict) -> list[str]:
    """The files upload_folder would pick with the patterns passed to it (its own filter, unmocked)."""
    every = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return sorted(
        filter_repo_objects(
            every, allow_patterns=upload.get("allow_patterns"), ignore_patterns=upload.get("ignore_patterns")
        )
    )


def test_push_uploads_exactly_the_checkpoint_and_its_card(checkpoint, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    hub = HubRecorder(monkeypatch)
    assert main(["push", str(checkpoint), "my-org/tiny-yarn", "--private"]) == 0

    (name, repo), (name2, upload) = hub.calls
    assert name == "create_repo" and name2 == "upload_folder"
    assert repo == {
        "repo_id": "my-org/tiny-yarn",
        "token": SECRET,
        "private": True,
        "exist_ok": True,
        "repo_type": "model",
    }
    assert upload["repo_id"] == "my-org/tiny-yarn" and upload["token"] == SECRET
    assert Path(upload["folder_path"]) == checkpoint
    assert uploaded(checkpoint, upload) == CHECKPOINT_FILES
    assert upload["commit_message"] == "Upload yarn x4.0 checkpoint (32 -> 128 tokens) with hf-posext"

    card = ModelCard.load(checkpoint / "README.md")
    assert card.data.base_model == "my-org/tiny-base"
    assert card.data.library_name == "transformers"
    assert {"hf-posext", "long-context", "yarn"} <= set(card.data.tags)
    for row in (
        "| method | yarn |",
        "| factor | 4.0 |",
        "| original context | 32 |",
        "| extended context | 128 |",
        "| steps | 400 |",
    ):
        assert row in card.text

    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    assert "uploaded 7 files to https://huggingface.co/my-org/tiny-yarn" in out.out


def test_dry_run_needs_no_token_and_sends_nothing(checkpoint, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hub = HubRecorder(monkeypatch)
    result = push_to_hub(checkpoint, "my-org/tiny-yarn", dry_run=True)
    assert result.files == CHECKPOINT_FILES and result.url is None
    assert hub.calls == []


def test_missing_token_is_an_error_before_any_call(checkpoint, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))  # no token saved by `hf auth login`
    hub = HubRecorder(monkeypatch)
    with pytest.raises(ValueError, match="no Hugging Face token found"):
        push_to_hub(checkpoint, "my-org/tiny-yarn")
    assert hub.calls == []


@pytest.mark.parametrize("missing", ["config.json", "README.md", "model.safetensors"])
def test_incomplete_checkpoint_is_refused(checkpoint, monkeypatch, capsys, missing):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    hub = HubRecorder(monkeypatch)
    (checkpoint / missing).unlink()
    assert main(["push", str(checkpoint), "my-org/tiny-yarn"]) == 2
    err = capsys.readouterr().err
    assert "not a complete checkpoint" in err and (missing if missing != "model.safetensors" else "safetensors") in err
    assert SECRET not in err
    assert hub.calls == []


@pytest.mark.parametrize("repo_id", ["no-owner", "a/b/c", "/name"])
def test_bad_repo_id(checkpoint, repo_id):
    with pytest.raises(ValueError, match="repo_id must be 'owner/name'"):
        push_to_hub(checkpoint, repo_id, dry_run=True)
