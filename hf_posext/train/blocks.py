"""The recipe's training blocks: documents packed into fixed-length token blocks, cached, and dealt out.

BOS + tokens + EOS per document, cut into blocks, cached as a memory-mapped ``.npy``; a seeded
order per epoch makes the data position one integer (docs/notes/training.md). The short side of
the long/short mix (`load_document_blocks`) packs whole short documents instead, each kept
at its own length and positions.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data import default_cache_dir, is_local_dataset, iter_documents, resolve_local_files
from ..files import atomic_file
from .conversations import LossOn, RecordCounts, encoded_documents

_TOKENIZE_BATCH = 256
# 2: one reader for training and evaluation (raw bytes decoded, no newline translation).
_CACHE_VERSION = 2


def _fingerprint(
    items: Sequence[str],
    split: str,
    text_field: str,
    tokenizer: Any,
    block_len: int,
    max_blocks: int | None,
    kind: str = "stream",
) -> str:
    """A key that changes whenever the blocks would: data, tokenizer, block length, limit."""
    digest = hashlib.sha256()
    parts: list[Any] = [
        _CACHE_VERSION,
        split,
        text_field,
        block_len,
        max_blocks,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        len(tokenizer),
    ]
    if kind != "stream":  # the packed blocks' keys are unchanged by the kinds added after them
        parts.append(kind)
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


def _tokenize_to_blocks(
    documents: Iterable[str], tokenizer: Any, block_len: int, max_blocks: int | None, desc: str
) -> np.ndarray:
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
            blocks.append(stream[i * block_len : (i + 1) * block_len].astype(dtype))
        bar.update(full)
        carry = stream[full * block_len :]
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
    dataset: Sequence[str],
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
        cache_dir: where blocks are cached; default `default_cache_dir`.

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
        documents = iter_documents(dataset, split, text_field)
        blocks = _tokenize_to_blocks(documents, tokenizer, block_len, max_blocks, desc="tokenizing")
        if len(blocks) == 0:
            raise ValueError(
                f"dataset {dataset!r} holds fewer than {block_len} tokens: not one block of the sequence length"
            )
        # Written aside then renamed, so another rank or a crashed run never reads half a file.
        with atomic_file(path) as tmp, tmp.open("wb") as handle:
            np.save(handle, blocks)
    return np.load(path, mmap_mode="r")


#: Blocks of whole documents kept open for more documents while packing; past it the fullest is closed.
_OPEN_BLOCKS = 64


def _pack_documents(
    documents: Iterable[tuple[np.ndarray, np.ndarray]], pad: int, block_len: int, max_blocks: int | None, desc: str
) -> tuple[np.ndarray, int]:
    """Whole encoded documents ``(ids, trained)`` of at most ``block_len`` tokens packed first-fit into blocks.

    Returns ``([blocks, 3, block_len] int32, documents packed)``: row 0 the token ids, row 1 each
    token's document number within its block (1, 2, ...; 0 for the padding that fills a block's end),
    row 2 whether the token is a target of the loss (1) or only context (0: a conversation's prompt).
    """
    closed: list[np.ndarray] = []
    open_blocks: list[list[tuple[np.ndarray, np.ndarray]]] = []  # each: the documents packed so far
    packed = 0
    bar = tqdm(desc=desc, unit=" blocks", total=max_blocks)

    def close(pieces: list[tuple[np.ndarray, np.ndarray]]) -> None:
        block = np.zeros((3, block_len), dtype=np.int32)
        block[0] = pad
        start = 0
        for number, (ids, trained) in enumerate(pieces, 1):
            block[0, start : start + len(ids)] = ids
            block[1, start : start + len(ids)] = number
            block[2, start : start + len(ids)] = trained
            start += len(ids)
        closed.append(block)
        bar.update(1)

    def used(pieces: list[tuple[np.ndarray, np.ndarray]]) -> int:
        return sum(len(ids) for ids, _ in pieces)

    for doc in documents:
        if not len(doc[0]) or len(doc[0]) > block_len:
            continue  # empty, or a long document: the long side's
        for pieces in open_blocks:
            if used(pieces) + len(doc[0]) <= block_len:
                pieces.append(doc)
                break
        else:
            open_blocks.append([doc])
        packed += 1
        if len(open_blocks) > _OPEN_BLOCKS:
            close(open_blocks.pop(max(range(len(open_blocks)), key=lambda i: used(open_blocks[i]))))
            if max_blocks is not None and len(closed) >= max_blocks:
                break
    while open_blocks and (max_blocks is None or len(closed) < max_blocks):
        close(open_blocks.pop(0))
    bar.close()
    if not closed:
        return np.zeros((0, 3, block_len), dtype=np.int32), packed
    return np.stack(closed), packed


def load_document_blocks(
    dataset: Sequence[str],
    tokenizer: Any,
    block_len: int,
    *,
    split: str = "train",
    text_field: str = "text",
    max_blocks: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    loss_on: LossOn = "assistant",
    skip_bad_records: bool = False,
    counts: RecordCounts | None = None,
) -> np.ndarray:
    """Whole documents and conversations of at most ``block_len`` tokens, packed, or from the cache.

    The short side of a long/short mix, and every sequence with ``packing``. Each document keeps
    its own length and its own positions (0, 1, ...): it is never cut and never continued by the
    next one (`document_positions`, `document_labels`). Text longer than a block is left
    out; a longer conversation is cut at a turn boundary (`conversations`).

    Args:
        loss_on: a conversation's targets: its assistant turns, or all its tokens.
        skip_bad_records: count and leave out bad records instead of stopping at the first.
        counts: filled with what was read (only when the blocks are built, not read from the cache,
            so the cache keeps them beside the blocks: ``<blocks>.json``).

    Returns:
        A read-only ``[blocks, 3, block_len]`` int32 array: token ids, each token's document number
        within its block (0: padding), and whether it is a target (1) of the loss.

    Raises:
        ValueError: no document of the data fits one block.
        BadRecord: a bad record (naming file and line), unless ``skip_bad_records``.
    """
    template = getattr(tokenizer, "chat_template", None)
    kind = f"documents-3:{loss_on}:{skip_bad_records}:{template}"
    key = _fingerprint(dataset, split, text_field, tokenizer, block_len, max_blocks, kind=kind)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / f"documents-{key}.npy"
    counts_path = path.with_suffix(".json")
    counts = counts if counts is not None else RecordCounts()
    if not path.is_file():
        documents = encoded_documents(
            dataset,
            tokenizer,
            block_len,
            split=split,
            text_field=text_field,
            loss_on=loss_on,
            skip_bad_records=skip_bad_records,
            counts=counts,
        )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        blocks, _ = _pack_documents(documents, pad, block_len, max_blocks, desc="packing documents")
        if len(blocks) == 0:
            raise ValueError(
                f"dataset {dataset!r} holds no document of at most {block_len} tokens (with BOS/EOS) to pack; "
                "raise short_seq_len or give short documents with short_dataset"
            )
        with atomic_file(counts_path) as tmp:
            tmp.write_text(json.dumps(counts.as_dict()))
        with atomic_file(path) as tmp, tmp.open("wb") as handle:
            np.save(handle, blocks)
    elif counts_path.is_file():
        saved = json.loads(counts_path.read_text())
        counts.__dict__.update(saved)
    return np.load(path, mmap_mode="r")


def document_positions(segments: torch.Tensor) -> torch.Tensor:
    """Position ids that restart at 0 with every document (and the padding) of packed ``[batch, seq]`` blocks.

    transformers reads such position ids, with no attention mask, as packed sequences and lets
    each token attend only within its own document (``find_packed_sequence_indices``).
    """
    seq = segments.shape[-1]
    index = torch.arange(seq, device=segments.device).expand_as(segments)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    start_index = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - start_index


def document_labels(
    input_ids: torch.Tensor, segments: torch.Tensor, trained: torch.Tensor | None = None, ignore_index: int = -100
) -> torch.Tensor:
    """The shifted targets of packed documents: the next token of the same document, else ``ignore_index``.

    No token predicts the next document's BOS, and the padding predicts nothing; with ``trained``
    (``[batch, seq]``, 1 for a target), neither do the tokens before an untrained one (a prompt's).
    """
    labels = torch.full_like(input_ids, ignore_index)
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, :-1] != 0)
    if trained is not None:
        same &= trained[:, 1:] != 0
    labels[:, :-1] = torch.where(same, input_ids[:, 1:], torch.full_like(input_ids[:, 1:], ignore_index))
    return labels


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
        yield order[offset : offset + micro_batch_size]
        index += 1


def packed_batch(
    blocks: np.ndarray, indices: list[int], device: Any, length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, positions, labels)`` ``[batch, seq]`` of packed document blocks (blocks.load_document_blocks).

    Each document at its own positions, attending to itself only (transformers reads restarting
    position ids as packed sequences), and predicting only its own trained tokens; ``length`` cuts
    the blocks (a window schedule's shorter window).
    """
    packed = torch.from_numpy(np.asarray(blocks[indices], dtype=np.int64))[..., :length].to(device)
    input_ids, segments = packed[:, 0], packed[:, 1]
    trained = packed[:, 2] if packed.shape[1] > 2 else None  # blocks cached before the target row: all trained
    return input_ids, document_positions(segments), document_labels(input_ids, segments, trained)


def take_blocks(blocks: np.ndarray, indices: list[int]) -> torch.Tensor:
    """``[len(indices), block_len]`` int64 token ids of the given blocks."""
    return torch.from_numpy(np.asarray(blocks[indices], dtype=np.int64))
