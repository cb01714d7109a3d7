"""Text for training and evaluation: local files, the Python standard library, or a Hub dataset.

One front-end for the recipe (`iter_documents`) and the evaluations (`load_texts`,
`encode_documents`); what each source means and why local files skip ``datasets``:
docs/guides/evaluation.md.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import sysconfig
import zlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from .files import default_cache_dir as default_cache_dir  # re-exported: the recipe's cache
from .validation import require

#: ``dataset``/``--data`` value selecting the Python standard library's sources.
STDLIB = "stdlib"
#: Files a folder contributes; a ``.jsonl`` file holds one document per line, the others one each.
TEXT_SUFFIXES = (".txt", ".md", ".py", ".jsonl")

#: A dataset item starting with it is a glob of files left out of the others (``!*/pydoc_data/*``).
EXCLUDE_PREFIX = "!"

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


def _looks_local(item: str) -> bool:
    return (
        item == STDLIB
        or any(ch in item for ch in "*?[")
        or item.startswith((EXCLUDE_PREFIX, ".", "/", "~"))
        or item.endswith((*TEXT_SUFFIXES, "/", os.sep))  # a folder: no Hub id ends with a slash
        or os.path.exists(os.path.expanduser(item))
        or os.sep in item
        and item.count("/") != 1
    )


def is_local_dataset(items: Sequence[str]) -> bool:
    """Whether ``items`` name local files (True) or one HF dataset (False).

    Raises:
        ValueError: for several items that are not all local.
    """
    local = [_looks_local(str(item)) for item in items]
    if all(local):
        return True
    if len(items) == 1:
        return False
    raise ValueError(f"dataset {list(items)!r}: give either local files/folders/globs or a single HF dataset name")


def resolve_local_files(items: Iterable[str | os.PathLike], split: str = "train") -> list[Path]:
    """Expand files, folders, globs and ``stdlib`` (its ``split``) into a file list (order fixes the data).

    An item ``!PATTERN`` leaves out every file whose path matches the glob ``PATTERN`` (``fnmatch``
    on the absolute path, so ``*`` also matches ``/``): e.g. ``stdlib !*/pydoc_data/*`` keeps the
    Python Language Reference, which the real-model evaluations read, out of training.

    Raises:
        FileNotFoundError: for an item that names no file, listing what was looked for, or an
            exclusion that matches none of the files (a mistyped pattern would silently keep them).
    """
    files: list[Path] = []
    excludes: list[str] = []
    for item in map(str, items):
        if item.startswith(EXCLUDE_PREFIX):
            excludes.append(item)
            continue
        expanded = os.path.expanduser(item)
        if item == STDLIB:
            matched = stdlib_files(split if split in ("train", "test", "all") else "train")  # type: ignore[arg-type]
        elif any(ch in expanded for ch in "*?["):
            matched = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
        elif os.path.isdir(expanded):
            matched = sorted(p for p in Path(expanded).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        elif os.path.isfile(expanded):
            matched = [Path(expanded)]
        else:
            raise FileNotFoundError(
                f"dataset {item!r} does not exist: expected a local file, a folder of "
                f"{'/'.join(TEXT_SUFFIXES)} files, a glob pattern, 'stdlib', or an HF dataset name (owner/name)"
            )
        if not matched:
            raise FileNotFoundError(f"dataset {item!r} matches no {'/'.join(TEXT_SUFFIXES)} file")
        files.extend(matched)
    for item in excludes:
        pattern = os.path.expanduser(item[len(EXCLUDE_PREFIX) :])
        kept = [path for path in files if not fnmatch.fnmatch(str(path.absolute()), pattern)]
        if len(kept) == len(files):
            raise FileNotFoundError(f"dataset exclusion {item!r} matches none of the dataset's files")
        files = kept
    if excludes and not files:
        raise FileNotFoundError(f"dataset {[str(i) for i in items]!r}: the exclusions leave no file")
    return files


def _datasets(name: str) -> Any:
    """The ``datasets`` package, needed to read ``name`` as an HF dataset.

    Raises:
        MissingExtra: ``datasets`` is not installed, naming ``name`` and the extra to install.
    """
    return require("datasets", "train", f"dataset {name!r} is not a local file, so it is read as an HF dataset, which")


def check_dataset(items: Sequence[str], split: str = "train") -> None:
    """Fail fast on a dataset that cannot be read: a missing local file or an unknown HF dataset.

    Raises:
        FileNotFoundError: a local file, folder or glob that matches nothing.
        MissingExtra: an HF dataset name without the ``datasets`` package (naming the extra).
    """
    if is_local_dataset(items):
        resolve_local_files(items, split)
        return
    _datasets(items[0])


def iter_local_documents(files: Iterable[Path], text_field: str = "text") -> Iterator[str]:
    """Yield the documents of ``files``: a whole file, or each ``.jsonl`` line's ``text_field``.

    Files are decoded from their bytes (undecodable bytes replaced, newlines kept as they are), so
    any source file loads and a byte tokenizer sees exactly the file.

    Raises:
        ValueError: a ``.jsonl`` line that is not UTF-8, not JSON or lacks ``text_field``, naming file and line.
    """
    for path in files:
        if path.suffix == ".jsonl":
            with path.open("rb") as handle:
                for number, raw in enumerate(handle, 1):
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as err:
                        raise ValueError(
                            f"{path}:{number}: not UTF-8 text (byte {raw[err.start : err.start + 1]!r} at column "
                            f"{err.start + 1}); .jsonl files must be UTF-8"
                        ) from None
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{path}:{number}: not a JSON line ({err.msg})") from err
                    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                        raise ValueError(f"{path}:{number}: no string field {text_field!r} (see --text-field)")
                    yield record[text_field]
        else:
            yield path.read_bytes().decode("utf-8", errors="replace")


def iter_hub_records(name: str, split: str) -> Iterator[dict[str, Any]]:
    """The rows of the HF dataset ``name``, streamed.

    Raises:
        FileNotFoundError: no dataset of that name (or split) loads.
        MissingExtra: ``datasets`` is not installed.
    """
    datasets = _datasets(name)
    try:
        stream = datasets.load_dataset(name, split=split, streaming=True)
    except Exception as err:  # datasets raises several unrelated types for a bad name/split
        raise FileNotFoundError(
            f"dataset {name!r}: no such local file or folder, and no HF dataset of that name loads "
            f"(split {split!r}): {err}"
        ) from err
    yield from stream


def _iter_hub_documents(name: str, split: str, text_field: str) -> Iterator[str]:
    for record in iter_hub_records(name, split):
        if text_field not in record:
            raise ValueError(f"HF dataset {name!r} has no column {text_field!r}; columns: {sorted(record)}")
        yield record[text_field]


def iter_documents(dataset: Sequence[str], split: str = "train", text_field: str = "text") -> Iterator[str]:
    """The documents of ``dataset`` (local files/folders/globs/``stdlib``, or one HF dataset name)."""
    if is_local_dataset(dataset):
        return iter_local_documents(resolve_local_files(dataset, split), text_field)
    return _iter_hub_documents(dataset[0], split, text_field)


def load_texts(
    data: Sequence[str], *, split: str = "test", text_field: str = "text", limit: int | None = None
) -> list[str]:
    """The non-empty documents of ``data`` for evaluation: ``stdlib``, files/folders/globs, or one dataset name.

    Args:
        data: as for `iter_documents`; a dataset name needs the ``datasets`` package (and the
            network unless the dataset is cached).
        split: the stdlib split (``test`` = held out) or the dataset split.
        text_field: the ``.jsonl`` field or dataset column holding the text.
        limit: keep at most this many texts (in file order, so the choice is stable).

    Raises:
        FileNotFoundError: a path that does not exist and is not a dataset name either.
        ValueError: an empty selection.
    """
    texts = list(islice((t for t in iter_documents(data, split, text_field) if t), limit))
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
