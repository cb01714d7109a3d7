"""The data front-end: file discovery, documents, cached blocks, sharding and resumable order."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hf_posext.data import check_dataset, load_texts, resolve_local_files
from hf_posext.train.blocks import load_blocks, micro_batch_indices
from hf_posext.testing import BOS_ID, EOS_ID, byte_tokenizer


class CountingTokenizer:
    """The byte tokenizer, counting how many texts it is asked to encode."""

    def __init__(self):
        self.inner = byte_tokenizer()
        self.texts = 0
        self.bos_token_id, self.eos_token_id = self.inner.bos_token_id, self.inner.eos_token_id
        self.backend_tokenizer = self.inner.backend_tokenizer

    def __len__(self):
        return len(self.inner)

    def __call__(self, texts, **kwargs):
        self.texts += len(texts)
        return self.inner(texts, **kwargs)


def reference_stream(documents: list[str]) -> list[int]:
    """BOS + bytes + EOS per document, concatenated: the YaRN recipe, written out by hand."""
    stream: list[int] = []
    for doc in documents:
        stream += [BOS_ID, *doc.encode("utf-8"), EOS_ID]
    return stream


def test_blocks_concatenate_documents_with_bos_eos_and_drop_the_tail(tmp_path):
    (tmp_path / "a.txt").write_text("first document ✓")
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"text": "second", "id": 1}) + "\n\n" + json.dumps({"text": "third one"}) + "\n"
    )
    blocks = load_blocks([str(tmp_path)], byte_tokenizer(), 8, cache_dir=tmp_path / "cache")
    stream = reference_stream(["first document ✓", "second", "third one"])
    assert blocks.shape == (len(stream) // 8, 8)
    assert blocks.reshape(-1).tolist() == stream[: len(stream) // 8 * 8]


def test_second_load_reads_the_cache_and_a_changed_file_invalidates_it(tmp_path):
    data = tmp_path / "notes.txt"
    data.write_text("x" * 100)
    tok = CountingTokenizer()
    first = np.array(load_blocks([str(data)], tok, 16, cache_dir=tmp_path / "cache"))
    assert tok.texts == 1
    again = load_blocks([str(data)], tok, 16, cache_dir=tmp_path / "cache")
    assert tok.texts == 1 and np.array_equal(first, again)
    data.write_text("y" * 100)
    changed = load_blocks([str(data)], tok, 16, cache_dir=tmp_path / "cache")
    assert tok.texts == 2 and changed[0, 1] == ord("y")
    # Another block length is another cache entry.
    assert load_blocks([str(data)], tok, 32, cache_dir=tmp_path / "cache").shape == (3, 32)


def test_glob_and_stdlib_sources(tmp_path):
    (tmp_path / "m.py").write_text("pass\n")
    assert resolve_local_files([str(tmp_path / "*.py")]) == [tmp_path / "m.py"]
    train_files = resolve_local_files(["stdlib"], split="train")
    test_files = resolve_local_files(["stdlib"], split="test")
    assert train_files and test_files and not set(train_files) & set(test_files)


def test_an_exclamation_item_leaves_matching_files_out(tmp_path):
    for name in ("keep.py", "eval/reference.py", "eval/other.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x\n")
    files = resolve_local_files([str(tmp_path), "!*/eval/*.py"])
    assert files == [tmp_path / "eval" / "other.txt", tmp_path / "keep.py"]
    # The recipe's real-model run: the standard library without the text the evaluations read.
    stdlib = resolve_local_files(["stdlib", "!*/pydoc_data/*"])
    assert stdlib and not any("pydoc_data" in path.parts for path in stdlib)
    assert any("pydoc_data" in path.parts for path in resolve_local_files(["stdlib"]))


def test_an_exclusion_matching_nothing_or_everything_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"exclusion '!\*/typo/\*' matches none"):
        resolve_local_files([str(tmp_path), "!*/typo/*"])
    with pytest.raises(FileNotFoundError, match="leave no file"):
        check_dataset([str(tmp_path), "!*.txt"])


def test_blocks_cache_changes_with_the_exclusions(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name * 40)
    tok = CountingTokenizer()
    both = load_blocks([str(tmp_path)], tok, 8, cache_dir=tmp_path / "cache")
    only_a = load_blocks([str(tmp_path), "!*/b.txt"], tok, 8, cache_dir=tmp_path / "cache")
    assert tok.texts == 3 and only_a.shape[0] < both.shape[0]


@pytest.mark.parametrize("item", ["missing/notes.txt", "/nowhere/*.jsonl", "./no-such-folder", "nosuchdir/"])
def test_missing_local_data_is_named(tmp_path, item):
    with pytest.raises(FileNotFoundError, match=item.replace("*", r"\*").replace(".", r"\.")):
        check_dataset([item])


def test_non_utf8_jsonl_line_is_named(tmp_path):
    (tmp_path / "d.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:2: not UTF-8 text \(byte b'\\xe9' at column 14\)"):
        load_texts([str(tmp_path / "d.jsonl")])


def test_bad_jsonl_line_is_named(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:2: no string field 'text'"):
        load_blocks([str(tmp_path / "d.jsonl")], byte_tokenizer(), 4, cache_dir=tmp_path)


def test_too_little_data_for_one_block(tmp_path):
    (tmp_path / "short.txt").write_text("abc")
    with pytest.raises(ValueError, match="fewer than 64 tokens"):
        load_blocks([str(tmp_path / "short.txt")], byte_tokenizer(), 64, cache_dir=tmp_path)


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def test_processes_get_disjoint_slices_covering_each_epoch():
    n, micro, procs = 23, 2, 3
    per_epoch = n // (micro * procs)
    shards = [take(micro_batch_indices(n, micro, procs, p, seed=5), per_epoch) for p in range(procs)]
    seen = [i for shard in shards for batch in shard for i in batch]
    assert len(seen) == len(set(seen)) == per_epoch * micro * procs
    # Global micro-batch k is one contiguous run of the epoch's permutation, split by rank.
    order = torch.randperm(n, generator=torch.Generator().manual_seed(5 * 1_000_003)).tolist()
    assert shards[0][1] + shards[1][1] + shards[2][1] == order[6:12]


def test_resumed_order_equals_the_uninterrupted_order():
    full = take(micro_batch_indices(10, 2, 2, 1, seed=0), 12)  # 2.4 epochs
    for start in (0, 1, 2, 5, 7):
        assert take(micro_batch_indices(10, 2, 2, 1, seed=0, start=start), 12 - start) == full[start:]
    assert full[:2] != full[2:4] or full[:2] != full[4:6]  # later epochs are reshuffled, not repeated


def test_fewer_blocks_than_one_micro_batch():
    with pytest.raises(ValueError, match="holds 3 blocks, fewer than one micro-batch"):
        next(micro_batch_indices(3, 2, 2, 0, seed=0))


def test_evaluation_and_training_read_the_same_documents(tmp_path):
    """One discovery rule and one reader: a folder gives eval and the recipe the same documents."""
    (tmp_path / "a.py").write_bytes(b"x = 1\r\n")  # kept byte for byte, no newline translation
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "from a record"}) + "\n")
    (tmp_path / "c.bin").write_bytes(b"\x00skipped")
    assert load_texts([str(tmp_path)]) == ["x = 1\r\n", "from a record"]
    blocks = load_blocks([str(tmp_path)], byte_tokenizer(), 4, cache_dir=tmp_path / "cache")
    stream = reference_stream(["x = 1\r\n", "from a record"])
    assert blocks.reshape(-1).tolist() == stream[: len(stream) // 4 * 4]
