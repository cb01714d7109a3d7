"""Publish an extended checkpoint to the Hugging Face Hub: ``hf-posext push DIR REPO_ID``.

Only a complete checkpoint, only a model repository's files (``--include``/``--all`` for more);
the token comes from ``HF_TOKEN`` or ``hf auth login`` and is never printed
(docs/guides/files_and_safety.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import HfApi, get_token
from huggingface_hub.utils import filter_repo_objects

from .repository import MODEL_REPO_FILES

#: What stays local even with ``--all``, as huggingface_hub patterns (``upload_folder(ignore_patterns=...)``, matched
#: with fnmatch against paths relative to the folder): hidden files and folders (temporary folders
#: of an interrupted save, caches), training states (``step_N/``, ``*-checkpoints/``), lock files.
IGNORE_PATTERNS = (
    ".*",
    "*/.*",
    "__pycache__/*",
    "*/__pycache__/*",
    "step_[0-9]*/*",
    "*/step_[0-9]*/*",
    "*-checkpoints/*",
    "*.tmp",
    "*.lock",
)


@dataclass(frozen=True)
class PushResult:
    """What `push_to_hub` uploaded (or would upload, for a dry run).

    Attributes:
        repo_id: the Hub repository.
        files: the uploaded paths, relative to the checkpoint folder, sorted.
        url: the commit URL, or None for a dry run.
        left_out: the folder's other files (not a model repository's), sorted; hidden files,
            training states and temporaries are not listed.
    """

    repo_id: str
    files: list[str]
    url: str | None
    left_out: list[str] = field(default_factory=list)


def allow_patterns(include: Sequence[str] = (), all_files: bool = False) -> list[str] | None:
    """The upload's ``allow_patterns``: a model repo's files plus ``include``; None (everything) for ``all_files``."""
    return None if all_files else [*MODEL_REPO_FILES, *include]


def checkpoint_files(folder: str | os.PathLike, include: Sequence[str] = (), all_files: bool = False) -> list[str]:
    """The files of the checkpoint in ``folder`` that belong on the Hub, as sorted relative paths.

    Args:
        folder: the checkpoint folder.
        include: more name patterns to send (fnmatch, relative to ``folder``), e.g. ``"*.ipynb"``.
        all_files: send every file except hidden ones, training states and temporaries.

    Raises:
        FileNotFoundError: ``folder`` is missing or lacks ``config.json``, safetensors weights
            or a ``README.md`` model card.
    """
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint folder {str(root)!r} does not exist")
    every = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    # The filter upload_folder applies, so this list is what an upload sends.
    files = sorted(
        filter_repo_objects(
            every, allow_patterns=allow_patterns(include, all_files), ignore_patterns=list(IGNORE_PATTERNS)
        )
    )
    missing = [name for name in ("config.json", "README.md") if name not in files]
    if not any(name.endswith(".safetensors") for name in files):
        missing.append("*.safetensors weights")
    if missing:
        raise FileNotFoundError(
            f"{str(root)!r} is not a complete checkpoint: missing {', '.join(missing)} "
            "(write one with hf-posext finetune or hf-posext patch)"
        )
    return files


def _commit_message(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    record = config.get("hf_posext") or {}
    if not record:
        return "Upload checkpoint with hf-posext"
    return (
        f"Upload {record.get('method')} x{record.get('factor')} checkpoint "
        f"({record.get('original_max_position_embeddings')} -> {record.get('context_length')} tokens) with hf-posext"
    )


def push_to_hub(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    dry_run: bool = False,
    endpoint: str | None = None,
    include: Sequence[str] = (),
    all_files: bool = False,
) -> PushResult:
    """Create ``repo_id`` if needed and upload the checkpoint in ``folder`` in one commit.

    Args:
        folder: a checkpoint written by the fine-tune recipe or ``hf-posext patch``.
        repo_id: ``owner/name`` on the Hub.
        private: create the repository private (an existing repository keeps its visibility).
        revision: the branch to commit to; default the main branch.
        commit_message: default: method, factor and contexts from the checkpoint's config.
        dry_run: only check the folder and list the files; needs no token and no network.
        endpoint: a Hub endpoint other than huggingface.co (default: ``HF_ENDPOINT`` or the Hub).
        include, all_files: send more than a model repository's files (see `checkpoint_files`).

    Returns:
        A `PushResult`.

    Raises:
        FileNotFoundError: an incomplete checkpoint.
        ValueError: a repository id that is not ``owner/name``, or no token found.
    """
    folder = Path(folder)
    files = checkpoint_files(folder, include, all_files)
    every = checkpoint_files(folder, all_files=True)
    left_out = [name for name in every if name not in files]
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"repo_id must be 'owner/name', got {repo_id!r}")
    if dry_run:
        return PushResult(repo_id, files, None, left_out)
    token = get_token()
    if token is None:
        raise ValueError("no Hugging Face token found: set HF_TOKEN or run `hf auth login` (needs write access)")
    api = HfApi(endpoint=endpoint, token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    if revision is not None:
        api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
    commit = api.upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        repo_type="model",
        revision=revision,
        allow_patterns=allow_patterns(include, all_files),
        ignore_patterns=list(IGNORE_PATTERNS),
        commit_message=commit_message or _commit_message(folder),
    )
    return PushResult(repo_id, files, str(getattr(commit, "commit_url", commit)), left_out)
