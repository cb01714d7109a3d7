"""Training data the YaRN way: documents -> BOS + tokens + EOS, concatenated, cut into blocks.

The YaRN recipe (arXiv 2309.00071, section 4) trains on PG19 books concatenated with BOS/EOS
between documents and chunked into fixed-length blocks, so every sequence is full and long
documents span many blocks. :func:`load_blocks` does exactly that for

* local files: ``.txt`` (one document per file), ``.jsonl`` (one JSON object per line, text
  in ``text_field``), folders (every ``.txt``/``.jsonl`` below them) and glob patterns (any
  matched file; files other than ``.jsonl`` are read as plain text, so
  ``'/usr/lib/python3.11/**/*.py'`` trains on source code);
* ``stdlib``: the Python standard library's sources in the split ``dataset_split`` names
  (:func:`hf_posext.eval.data.stdlib_files`; ``train`` here, its held-out ``test`` split is what
  ``hf-posext eval`` scores), real text that every machine has, for offline runs;
* an HF dataset name (needs the ``datasets`` package), streamed and tokenized only as far as
  the run needs.

The blocks are cached as a ``.npy`` file keyed by the data, the tokenizer and the block length,
so a second run (or the other ranks of this one) does not re-tokenize; the cache is
memory-mapped, so 64k-token blocks of a large corpus do not have to fit in RAM.

Block order is a seeded permutation per epoch and each process takes its own slice of every
global micro-batch (:func:`micro_batch_indices`), so the data position of a run is one integer,
the number of micro-batches consumed, which makes resuming exact and free.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

LOCAL_SUFFIXES = (".txt", ".jsonl")
#: ``dataset`` value selecting the Python standard library's sources.
STDLIB = "stdlib"
_TOKENIZE_BATCH = 256
_CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """``$HF_POSEXT_CACHE``, else ``~/.cache/hf_posext``."""
    return Path(os.environ.get("HF_POSEXT_CACHE", Path.home() / ".cache" / "hf_posext"))


def _looks_local(item: str) -> bool:
    return (
        item == STDLIB
        or any(ch in item for ch in "*?[")
        or item.startswith((".", "/", "~"))
        or item.endswith(LOCAL_SUFFIXES)
        or os.path.exists(item)
        or os.sep in item and item.count("/") != 1
    )


def resolve_local_files(items: Iterable[str], split: str = "train") -> list[Path]:
    """Expand files, folders, globs and ``stdlib`` into a sorted list of files (order fixes the data).

    Raises:
        FileNotFoundError: for an item that names no file, listing what was looked for.
    """
    files: list[Path] = []
    for item in items:
        expanded = os.path.expanduser(item)
        if item == STDLIB:
            from ..eval.data import stdlib_files

            matched = stdlib_files(split if split in ("train", "test", "all") else "train")
        elif any(ch in expanded for ch in "*?["):
            matched = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
        elif os.path.isdir(expanded):
            matched = sorted(p for p in Path(expanded).rglob("*") if p.is_file() and p.suffix in LOCAL_SUFFIXES)
        elif os.path.isfile(expanded):
            matched = [Path(expanded)]
        else:
            raise FileNotFoundError(
                f"dataset {item!r} does not exist: expected a local .txt/.jsonl file, a folder of them, "
                "a glob pattern, or an HF dataset name (owner/name)"
            )
        if not matched:
            raise FileNotFoundError(f"dataset {item!r} matches no {'/'.join(LOCAL_SUFFIXES)} file")
        files.extend(matched)
    return files


def is_local_dataset(items: list[str]) -> bool:
    """Whether ``items`` name local files (True) or one HF dataset (False).

    Raises:
        ValueError: for several items that are not all local.
    """
    local = [_looks_local(item) for item in items]
    if all(local):
        return True
    if len(items) == 1:
        return False
    raise ValueError(f"dataset {items!r}: give either local files/folders/globs or a single HF dataset name")


def check_dataset(items: list[str], split: str = "train") -> None:
    """Fail fast on a dataset that cannot be read: a missing local file or an unknown HF dataset.

    Raises:
        FileNotFoundError: a local file, folder or glob that matches nothing.
        ImportError: an HF dataset name without the ``datasets`` package.
    """
    if is_local_dataset(items):
        resolve_local_files(items, split)
        return
    try:
        import datasets  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"dataset {items[0]!r} is not a local file, so it is read as an HF dataset, which needs the "
            "'datasets' package: pip install datasets"
        ) from err


def iter_local_documents(files: list[Path], text_field: str = "text") -> Iterator[str]:
    """Yield the documents of ``files``: a whole text file, or each ``.jsonl`` line's ``text_field``.

    Raises:
        ValueError: a ``.jsonl`` line that is not JSON or lacks ``text_field``, naming file and line.
    """
    for path in files:
        if path.suffix == ".jsonl":
            with path.open(encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
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
            yield path.read_text(encoding="utf-8", errors="replace")


def _iter_hub_documents(name: str, split: str, text_field: str) -> Iterator[str]:
    import datasets

    try:
        stream = datasets.load_dataset(name, split=split, streaming=True)
    except Exception as err:  # datasets raises several unrelated types for a bad name/split
        raise FileNotFoundError(f"cannot load HF dataset {name!r} (split {split!r}): {err}") from err
    for record in stream:
        if text_field not in record:
            raise ValueError(f"HF dataset {name!r} has no column {text_field!r}; columns: {sorted(record)}")
        yield record[text_field]


def _fingerprint(items: list[str], split: str, text_field: str, tokenizer: Any, block_len: int,
                 max_blocks: int | None) -> str:
    """A key that changes whenever the blocks would: data, tokenizer, block length, limit."""
    digest = hashlib.sha256()
    parts: list[Any] = [_CACHE_VERSION, split, text_field, block_len, max_blocks,
                        tokenizer.bos_token_id, tokenizer.eos_token_id, len(tokenizer)]
    if is_local_dataset(items):
        for path in resolve_local_files(items, split):
            stat = path.stat()
            parts.append((str(path.resolve()), stat.st_size, stat.st_mtime_ns))
    else:
        parts.append(items[0])
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts.append(backend.to_str() if backend is not None else sorted(tokenizer.get_vocab().items()))
    for part in parts:
        digest.update(repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def _tokenize_to_blocks(documents: Iterable[str], tokenizer: Any, block_len: int, max_blocks: int | None,
                        desc: str) -> np.ndarray:
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.int32
    blocks: list[np.ndarray] = []
    carry = np.zeros(0, dtype=np.int64)
    bar = tqdm(desc=desc, unit=" blocks", total=max_blocks)

    def flush(batch: list[str]) -> bool:
        nonlocal carry
        encoded = tokenizer(batch, add_special_tokens=False)["input_ids"]
        pieces = [carry]
        for ids in encoded:
            if bos is not None:
                pieces.append(np.array([bos]))
            pieces.append(np.asarray(ids, dtype=np.int64))
            if eos is not None:
                pieces.append(np.array([eos]))
        stream = np.concatenate(pieces)
        full = len(stream) // block_len
        if max_blocks is not None:
            full = min(full, max_blocks - len(blocks))
        for i in range(full):
            blocks.append(stream[i * block_len:(i + 1) * block_len].astype(dtype))
        bar.update(full)
        carry = stream[full * block_len:]
        return max_blocks is not None and len(blocks) >= max_blocks

    batch: list[str] = []
    for document in documents:
        batch.append(document)
        if len(batch) == _TOKENIZE_BATCH:
            if flush(batch):
                break
            batch = []
    else:
        if batch:
            flush(batch)
    bar.close()
    # The tail shorter than a block is dropped, as in the YaRN recipe: blocks stay full-length.
    if not blocks:
        return np.zeros((0, block_len), dtype=dtype)
    return np.stack(blocks)


def load_blocks(
    dataset: list[str],
    tokenizer: Any,
    block_len: int,
    *,
    split: str = "train",
    text_field: str = "text",
    max_blocks: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> np.ndarray:
    """Tokenize ``dataset`` into fixed-length blocks, or read them from the cache.

    Args:
        dataset: local files/folders/globs, or one HF dataset name.
        tokenizer: a transformers tokenizer with ``bos_token_id``/``eos_token_id``.
        block_len: tokens per block (the training sequence length).
        split: the HF dataset split.
        text_field: the text column of ``.jsonl`` records and HF datasets.
        max_blocks: stop after this many blocks (an HF dataset is streamed only that far);
            None tokenizes everything.
        cache_dir: where blocks are cached; default :func:`default_cache_dir`.

    Returns:
        A read-only ``[blocks, block_len]`` integer array (memory-mapped from the cache).

    Raises:
        FileNotFoundError: missing local data or an unknown HF dataset.
        ValueError: data too short for a single block.
    """
    key = _fingerprint(dataset, split, text_field, tokenizer, block_len, max_blocks)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / f"blocks-{key}.npy"
    if not path.is_file():
        if is_local_dataset(dataset):
            documents = iter_local_documents(resolve_local_files(dataset, split), text_field)
        else:
            documents = _iter_hub_documents(dataset[0], split, text_field)
        blocks = _tokenize_to_blocks(documents, tokenizer, block_len, max_blocks, desc="tokenizing")
        if len(blocks) == 0:
            raise ValueError(
                f"dataset {dataset!r} holds fewer than {block_len} tokens: not one block of the sequence length"
            )
        cache.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a reader (another rank, a crashed run) never sees half a file.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as handle:
            np.save(handle, blocks)
        os.replace(tmp, path)
    return np.load(path, mmap_mode="r")


def micro_batch_indices(
    num_blocks: int,
    micro_batch_size: int,
    num_processes: int,
    process_index: int,
    seed: int,
    start: int = 0,
) -> Iterator[list[int]]:
    """Block indices of this process's micro-batches, from micro-batch ``start`` on, forever.

    Every epoch is a permutation of the blocks seeded by ``(seed, epoch)``; global micro-batch
    ``k`` is ``micro_batch_size * num_processes`` consecutive entries of it, of which process
    ``p`` takes the ``p``-th slice. A resumed run passes the number of micro-batches already
    consumed as ``start`` and gets exactly the batches an uninterrupted run would have seen.

    Raises:
        ValueError: if there are fewer blocks than one global micro-batch.
    """
    per_step = micro_batch_size * num_processes
    per_epoch = num_blocks // per_step
    if per_epoch == 0:
        raise ValueError(
            f"the data holds {num_blocks} blocks, fewer than one micro-batch on every process "
            f"({micro_batch_size} x {num_processes}); add data or lower the sequence length"
        )
    index = start
    epoch, order = -1, None
    while True:
        this_epoch, within = divmod(index, per_epoch)
        if this_epoch != epoch:
            epoch = this_epoch
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            order = torch.randperm(num_blocks, generator=generator).tolist()
        offset = within * per_step + process_index * micro_batch_size
        yield order[offset:offset + micro_batch_size]
        index += 1


def take_blocks(blocks: np.ndarray, indices: list[int]) -> torch.Tensor:
    """``[len(indices), block_len]`` int64 token ids of the given blocks."""
    return torch.from_numpy(np.asarray(blocks[indices], dtype=np.int64))
