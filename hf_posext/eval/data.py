"""Evaluation text: files, folders, the Python standard library, or a Hugging Face dataset.

Every Python install carries ~13-30 MB of real text, its standard library's source, so the
evaluations and the demo run on a fresh machine with no network. It is split into a training
and a held-out part by a hash of each file's relative path, so the split is the same on every
machine with the same Python version and never depends on file-system order.
"""

from __future__ import annotations

import sysconfig
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

#: ``--data`` value that selects the standard library's held-out files.
STDLIB = "stdlib"

Split = Literal["train", "test", "all"]


class Tokenizer(Protocol):
    """What the evaluations need from a tokenizer; transformers tokenizers qualify."""

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str: ...


def stdlib_files(split: Split = "test", test_fraction: float = 0.1) -> list[Path]:
    """The standard library's ``.py`` files, sorted, in a deterministic train/test split.

    Args:
        split: ``"train"``, ``"test"`` (held out, about ``test_fraction`` of the files) or ``"all"``.
        test_fraction: the share of files held out, in (0, 1).

    Raises:
        ValueError: for an unknown split or a fraction outside (0, 1).
    """
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        # Installed third-party packages are not the standard library and differ between machines.
        if {"site-packages", "dist-packages"} & set(rel.parts):
            continue
        held_out = zlib.crc32(rel.as_posix().encode()) % 1000 < test_fraction * 1000
        if split == "all" or held_out == (split == "test"):
            files.append(path)
    return files


def resolve_paths(items: Iterable[str | Path], suffixes: tuple[str, ...] = (".py", ".txt", ".md")) -> list[Path]:
    """Expand files and folders (recursively, files ending in ``suffixes``) into a sorted file list.

    Raises:
        FileNotFoundError: naming an item that does not exist.
    """
    paths: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():
            paths.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes))
        elif path.is_file():
            paths.append(path)
        else:
            raise FileNotFoundError(f"no such file or folder: {str(item)!r}")
    return paths


def read_texts(paths: Iterable[str | Path]) -> list[str]:
    """The files' contents as text (undecodable bytes replaced, so any source file loads)."""
    return [Path(p).read_bytes().decode("utf-8", errors="replace") for p in paths]


def load_texts(data: Sequence[str], *, split: str = "test", text_column: str = "text", limit: int | None = None) -> list[str]:
    """Texts from ``--data``: ``stdlib``, files/folders, or one Hugging Face dataset name.

    Args:
        data: ``["stdlib"]``, paths to files or folders, or one dataset name that is not a path
            (needs the ``datasets`` package, and the network unless the dataset is cached).
        split: the stdlib split (``test`` = held out) or the dataset split.
        text_column: the dataset column holding the text.
        limit: keep at most this many texts (after sorting/splitting, so the choice is stable).

    Raises:
        FileNotFoundError: a path that does not exist and is not a dataset name either.
        ValueError: an empty selection.
    """
    if list(data) == [STDLIB]:
        texts = read_texts(stdlib_files(split))  # type: ignore[arg-type]
    elif len(data) == 1 and not Path(data[0]).expanduser().exists():
        try:
            import datasets
        except ImportError as err:
            raise FileNotFoundError(
                f"{data[0]!r} is not a file or folder; to read it as a Hugging Face dataset install `datasets`"
            ) from err
        dataset = datasets.load_dataset(data[0], split=split)
        if text_column not in dataset.column_names:
            raise ValueError(f"dataset {data[0]!r} has no column {text_column!r}; columns: {dataset.column_names}")
        texts = list(dataset[text_column][:limit] if limit else dataset[text_column])
    else:
        texts = read_texts(resolve_paths(data))
    texts = [t for t in texts if t]
    if limit is not None:
        texts = texts[:limit]
    if not texts:
        raise ValueError(f"no text found in {list(data)!r}")
    return texts


def encode_documents(texts: Iterable[str], tokenizer: Tokenizer, add_bos: bool = True) -> list[torch.Tensor]:
    """Tokenize each text as one document, ``[seq]`` int64 each, with the BOS token when there is one.

    A leading BOS matches how the models were trained and how the YaRN repo evaluates
    (``add_start_token``); tokenizers without a BOS token (byte-level ones) get none.
    """
    bos = getattr(tokenizer, "bos_token_id", None) if add_bos else None
    documents = []
    for text in texts:
        try:
            ids = list(tokenizer.encode(text, add_special_tokens=False))
        except TypeError:  # a minimal tokenizer without the keyword
            ids = list(tokenizer.encode(text))
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        documents.append(torch.tensor(ids, dtype=torch.long))
    return documents
