"""Dual Chunk Attention: config validation, ChunkLlama's defaults, parity with its float64 three-part positions."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.helpers.training_free_reference import dca_scores, reference_model
from tests.helpers.models import tiny_model, tokens

import hf_posext
from hf_posext.attention.remap import attention as remap
from hf_posext.attention.remap import flash_segments
from hf_posext.methods.dca import DualChunkConfig

L0 = 64


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("block_elements", [remap.BLOCK_ELEMENTS, 4 * 192 * 7])
@pytest.mark.parametrize(("chunk", "local"), [(48, 8), (40, 30)])  # defaults; a local window with 2c - 1 < chunk
def test_matches_chunkllama_float64_reference_at_3x(arch, impl, block_elements, chunk, local, monkeypatch):
    monkeypatch.setattr(remap, "BLOCK_ELEMENTS", block_elements)
    monkeypatch.setattr(flash_segments, "FLASH_BLOCK", block_elements // (4 * 192))
    base = tiny_model(arch, attn_implementation=impl)
    ids = tokens(3 * L0)
    expected = logits(reference_model(base, dca_scores, chunk_size=chunk, local_size=local), ids)
    patched = hf_posext.patch_model(copy.deepcopy(base), "dca", chunk_size=chunk, local_size=local)
    assert (logits(patched, ids) - expected).abs().max() <= 1e-4
    assert (logits(base, ids) - expected).abs().max() > 1e-2


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_inside_the_first_chunk_the_model_is_unchanged_bit_for_bit(impl):
    base = tiny_model("llama", attn_implementation=impl)
    ids = tokens(40)  # c = 48 - 8
    patched = hf_posext.patch_model(copy.deepcopy(base), "dca")
    assert torch.equal(logits(patched, ids), logits(base, ids))


def test_defaults_are_chunkllamas():
    assert DualChunkConfig().resolve(L0) == (48, 8)
    model = hf_posext.patch_model(tiny_model("llama"), "dca", factor=4)
    assert model.config.max_position_embeddings == 4 * L0
    assert model.config.dual_chunk_attention_config == {
        "chunk_size": 48,
        "local_size": 8,
        "original_max_position_embeddings": L0,
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_size": 1}, r"chunk_size must be an int >= 2.*got 1"),
        ({"chunk_size": 32.0}, r"chunk_size must be an int >= 2.*got 32.0"),
        ({"local_size": 0}, r"local_size must be an int >= 1.*got 0"),
        ({"local_size": True}, r"local_size must be an int >= 1.*got True"),
    ],
)
def test_bad_values_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DualChunkConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_size": 65}, r"chunk_size must be an int in \[2, 64\].*got 65"),
        ({"chunk_size": 32, "local_size": 32}, r"local_size must be an int in \[1, 32\).*got 32"),
    ],
)
def test_values_out_of_range_for_the_model_raise_before_anything_changes(kwargs, message):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match=message):
        hf_posext.patch_model(model, "dca", **kwargs)
    assert hf_posext.patch_info(model)["method"] is None
    assert not hasattr(model.config, "dual_chunk_attention_config")


def test_unpatch_removes_the_engine_field():
    model = hf_posext.patch_model(tiny_model("llama"), "dca")
    hf_posext.unpatch_model(model)
    assert not hasattr(model.config, "dual_chunk_attention_config")
    assert model.config._attn_implementation == "eager"
