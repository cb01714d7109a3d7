"""The byte tokenizer and the tiny checkpoints the recipe's smoke runs start from."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_posext.testing import (
    BOS_ID,
    BYTE_VOCAB_SIZE,
    EOS_ID,
    PAD_ID,
    TINY_ARCHITECTURES,
    TINY_VOCAB_SIZE,
    byte_tokenizer,
    make_tiny_model,
)

TEXTS = ["def f(x):\n\treturn x  # ok", "héllo wörld ✓ \x00\x7f", "", " leading and trailing spaces  "]


@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_utf8_bytes_and_round_trip(text):
    tok = byte_tokenizer()
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok(text).input_ids == [BOS_ID, *ids]


def test_special_tokens_and_vocab():
    tok = byte_tokenizer()
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    assert len(tok) == BYTE_VOCAB_SIZE


def test_saved_tokenizer_reloads_through_auto_tokenizer(tmp_path):
    # test_train_loop.py also reloads it in an interpreter that never imports hf_posext.
    byte_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok("héllo").input_ids == [BOS_ID, *"héllo".encode()]
    assert tok.eos_token_id == EOS_ID


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_tiny_model_loads_through_auto_classes(tmp_path, arch):
    path = make_tiny_model(tmp_path / arch, arch, max_position_embeddings=96)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == arch
    assert model.config.max_position_embeddings == 96
    assert model.config.vocab_size >= len(tok)
    batch = tok(["some text"], return_tensors="pt")
    assert batch.input_ids.tolist() == [[BOS_ID, *b"some text"]]
    logits = model(**batch).logits
    assert logits.shape == (1, batch.input_ids.shape[1], TINY_VOCAB_SIZE)
    assert torch.isfinite(logits).all()


def test_tiny_model_rejects_bad_shapes(tmp_path):
    with pytest.raises(ValueError, match="gpt2"):
        make_tiny_model(tmp_path / "m", "gpt2")
    with pytest.raises(ValueError, match="num_heads=3"):
        make_tiny_model(tmp_path / "m", num_heads=3)
