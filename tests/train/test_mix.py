"""The recipe's long/short mix: whole short documents at their own length beside the long samples.

What it promises: short documents are packed whole (never cut, never continued by the next one),
each at its own positions and attending only to itself, so a packed block scores exactly as its
documents scored one by one, for every method family; ``short_fraction`` of the micro-batches are
short, evenly spread and the same on every process; a mixed run resumes bit-identical; with
``longrope`` the short micro-batches train the short factors and the long ones the long factors
(LongRoPE2's mixed-window training).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hf_posext import patch_model
from hf_posext.testing import byte_tokenizer, make_tiny_model
from hf_posext.train import steps
from hf_posext.train.blocks import _pack_documents, document_labels, document_positions, load_document_blocks
from hf_posext.train.saved_state import latest_checkpoint
from hf_posext.train.config import TrainConfig
from hf_posext.train.conversations import encoded_documents
from hf_posext.train.loop import train
from hf_posext.train.micro_batches import shorts_before

from tests.helpers.finetune import record_forward_loss
from tests.train.test_loop import KILL_SCRIPT, ROOT, SUBPROCESS_ENV, config

ORIGINAL_CONTEXT = 32

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("mix"))


def make_assets(root: Path) -> Path:
    """A tiny Llama (32-token context), long text, and a .jsonl of short documents of many lengths."""
    make_tiny_model(
        root / "llama", hidden_size=32, num_heads=2, num_kv_heads=1, max_position_embeddings=ORIGINAL_CONTEXT
    )
    byte_tokenizer(model_max_length=ORIGINAL_CONTEXT).save_pretrained(root / "llama")
    (root / "data.txt").write_text((Path(json.__file__).parent / "decoder.py").read_text() * 4)
    lengths = [3, 9, 14, 5, 27, 11, 2, 7, 40, 18, 6, 12]  # 40 > any short block: left out
    documents = [{"text": "".join(chr(97 + (i + j) % 26) for j in range(n))} for i, n in enumerate(lengths * 4)]
    (root / "short.jsonl").write_text("\n".join(json.dumps(d) for d in documents))
    return root


def test_documents_are_packed_whole_and_long_ones_left_out(tmp_path):
    tokenizer = byte_tokenizer()
    texts = ["a" * n for n in (3, 10, 5, 40, 7, 0, 20, 1)]
    records = tmp_path / "texts.jsonl"
    records.write_text("\n".join(json.dumps({"text": text}) for text in texts))
    documents = encoded_documents([str(records)], tokenizer, 24)
    blocks, packed = _pack_documents(documents, tokenizer.pad_token_id, 24, None, "test")
    assert blocks.dtype == np.int32 and blocks.shape[1:] == (3, 24)
    found = []
    for ids, segments, trained in blocks:
        assert (trained == (segments > 0)).all(), "text is trained everywhere, the padding nowhere"
        assert (np.diff(segments[segments > 0]) >= 0).all(), "a document's tokens are contiguous"
        for number in range(1, segments.max() + 1):
            doc = ids[segments == number]
            assert doc[0] == tokenizer.bos_token_id and doc[-1] == tokenizer.eos_token_id
            found.append(len(doc) - 2)
        assert (ids[segments == 0] == tokenizer.pad_token_id).all()
    # Every document that fits (with BOS and EOS: 22 tokens, so 20 does and 40 does not) once, whole;
    # the empty one is no document.
    assert sorted(found) == [1, 3, 5, 7, 10, 20]
    assert packed == 6


def test_positions_restart_and_labels_stay_within_each_document():
    segments = torch.tensor([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    ids = torch.arange(14).view(2, 7)
    assert document_positions(segments).tolist() == [[0, 1, 2, 0, 1, 0, 1], [0, 1, 2, 3, 4, 5, 6]]
    assert document_labels(ids, segments).tolist() == [
        [1, 2, -100, 4, -100, -100, -100],
        [8, 9, 10, 11, 12, 13, -100],
    ]


def test_the_short_blocks_are_cached_and_refused_when_no_document_fits(assets, tmp_path):
    tokenizer = byte_tokenizer()
    data = [str(assets / "short.jsonl")]
    first = load_document_blocks(data, tokenizer, 32, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("documents-*.npy"))) == 1
    assert np.array_equal(load_document_blocks(data, tokenizer, 32, cache_dir=tmp_path), first)
    with pytest.raises(ValueError, match=r"no document of at most 3 tokens.*short_seq_len"):
        load_document_blocks(data, tokenizer, 3, cache_dir=tmp_path)


#: Settings that make each family act within a few dozen tokens (small windows and chunks).
FAMILIES = [
    ("yarn", {"factor": 2}),
    ("longrope", {"factor": 2}),
    ("dynamic_yarn", {"factor": 2}),
    ("alibi", {}),
    ("self_extend", {"group_size": 2, "window_size": 4}),
    ("dca", {"factor": 2, "chunk_size": 8, "local_size": 2}),
    ("string", {"factor": 2, "shift": 6, "local_window": 2}),
    ("rerope", {"factor": 2, "window": 4}),
]


@pytest.mark.parametrize(("method", "kwargs"), FAMILIES, ids=[m for m, _ in FAMILIES])
def test_a_packed_block_scores_as_its_documents_one_by_one(assets, method, kwargs):
    """Loss and gradients of a packed block equal the documents' own: the packing leaks nothing."""
    model = AutoModelForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32, attn_implementation="sdpa")
    patch_model(model, method, **kwargs)
    blocks = load_document_blocks([str(assets / "short.jsonl")], byte_tokenizer(), 32, cache_dir=assets / "cache")
    several = [i for i in range(len(blocks)) if blocks[i, 1].max() > 1][:3]  # blocks of several documents
    packed = torch.from_numpy(np.asarray(blocks[several], dtype=np.int64))
    ids, segments = packed[:, 0], packed[:, 1]
    labels = document_labels(ids, segments)

    model.zero_grad()
    together = steps.forward_loss(model, ids, document_positions(segments), shift_labels=labels)
    (together * (labels != -100).sum()).backward()
    grads_together = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    alone = torch.zeros(())
    for row in range(ids.shape[0]):
        for number in range(1, int(segments[row].max()) + 1):
            doc = ids[row][segments[row] == number][None]
            loss = steps.forward_loss(model, doc, torch.arange(doc.shape[1])[None])
            alone = alone + loss * (doc.shape[1] - 1)
    alone.backward()
    torch.testing.assert_close(together * (labels != -100).sum(), alone, rtol=1e-5, atol=1e-4)
    for got, want in zip(grads_together, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.4, 0.5, 0.9])
def test_short_micro_batches_are_the_given_fraction_evenly_spread(fraction):
    kinds = [shorts_before(k + 1, fraction) - shorts_before(k, fraction) for k in range(100)]
    assert set(kinds) <= {0, 1}
    assert sum(kinds) == round(100 * fraction)
    for start in range(0, 100, 10):  # evenly: every 10 micro-batches hold their share, rounded either way
        assert sum(kinds[start : start + 10]) in (int(10 * fraction), -int(-10 * fraction // 1))


def mixed(assets: Path, out: Path, **overrides) -> TrainConfig:
    values = dict(
        pose=True,
        factor=4,
        pose_window=ORIGINAL_CONTEXT,
        short_fraction=0.5,
        short_seq_len=16,
        short_dataset=[str(assets / "short.jsonl")],
        global_batch_size=2,
        micro_batch_size=1,
        activation_checkpointing=False,
        cache_dir=str(assets / "cache"),
    )
    values.update(overrides)
    return config(assets, out, **values)


def test_a_mixed_run_alternates_long_and_short_micro_batches(assets, tmp_path, monkeypatch):
    seen = record_forward_loss(
        monkeypatch,
        lambda model, ids, positions, pose, kw, loss: (
            ids.shape[1],
            pose,
            int(positions.max()),
            kw.get("shift_labels") is not None,
        ),
    )
    result = train(mixed(assets, tmp_path, max_train_steps=3))
    long, short = (ORIGINAL_CONTEXT, True), (16, False)
    assert [s[:2] for s in seen] == [long, short] * 3
    assert all(s[2] >= ORIGINAL_CONTEXT for s in seen[::2]), "long samples: PoSE positions beyond L_orig"
    assert all(s[2] < 16 and s[3] for s in seen[1::2]), "short samples: their own positions and labels"
    assert result.tokens == 3 * (ORIGINAL_CONTEXT + 16)
    card = (result.output_dir / "README.md").read_text()
    assert "50% of the micro-batches: whole documents of up to 16 tokens at their own positions" in card


def test_a_killed_mixed_run_resumes_bit_identical(assets, tmp_path):
    reference = train(mixed(assets, tmp_path / "straight", checkpointing_steps=2))
    crashed = mixed(assets, tmp_path / "crashed", checkpointing_steps=2)
    script = KILL_SCRIPT.format(kill_step=5, values=crashed.to_dict())
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=SUBPROCESS_ENV)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert latest_checkpoint(crashed.checkpoint_path).name == "step_00000004"
    resumed = train(mixed(assets, tmp_path / "crashed", checkpointing_steps=2, resume="latest"))
    assert resumed.losses == reference.losses
    expected = load_file(Path(reference.output_dir) / "model.safetensors")
    got = load_file(Path(resumed.output_dir) / "model.safetensors")
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_resuming_with_another_mix_is_refused(assets, tmp_path):
    train(mixed(assets, tmp_path, max_train_steps=2, warmup_steps=0, checkpointing_steps=2))
    with pytest.raises(ValueError, match=r"short_fraction: 0.5 -> 0.25"):
        train(mixed(assets, tmp_path, max_train_steps=2, warmup_steps=0, short_fraction=0.25, resume="latest"))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"short_fraction": 1.0}, r"short_fraction must be"),
        ({"short_fraction": -0.1}, r"short_fraction must be"),
        ({"short_seq_len": 1}, r"short_seq_len must be"),
    ],
)
def test_bad_mix_settings_are_one_line(assets, tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        mixed(assets, tmp_path, **overrides)


def test_a_short_side_longer_than_the_sequence_is_refused_before_training(assets, tmp_path):
    with pytest.raises(ValueError, match=r"short_seq_len=200 exceeds seq_len=128"):
        train(mixed(assets, tmp_path, short_seq_len=200))
    assert not (tmp_path / "model").exists()
