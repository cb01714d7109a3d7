"""ReRoPE and leaky ReRoPE: config validation, authors' defaults, parity with a float64 relative-position reference."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.helpers.training_free_reference import reference_model, rerope_scores
from tests.helpers.models import tiny_model, tokens

import hf_posext
from hf_posext.attention.remap import attention as remap
from hf_posext.attention.remap import flash_segments
from hf_posext.methods.rerope import ReRopeConfig

L0 = 64


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("block_elements", [remap.BLOCK_ELEMENTS, 4 * 192 * 7])
@pytest.mark.parametrize(("window", "leak"), [(16, None), (16, 4), (8, 16.0)])
def test_matches_the_authors_float64_reference_at_3x(arch, impl, block_elements, window, leak, monkeypatch):
    monkeypatch.setattr(remap, "BLOCK_ELEMENTS", block_elements)
    monkeypatch.setattr(
        flash_segments, "FLASH_BLOCK", block_elements // (4 * 192)
    )  # 7-row blocks: every piece boundary is crossed
    base = tiny_model(arch, attn_implementation=impl)
    ids = tokens(3 * L0)
    expected = logits(reference_model(base, rerope_scores, window=window, leak=leak), ids)
    patched = hf_posext.patch_model(copy.deepcopy(base), "rerope", window=window, leak=leak)
    assert (logits(patched, ids) - expected).abs().max() <= 1e-4
    assert (logits(base, ids) - expected).abs().max() > 1e-2  # the remapping shows in the logits


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("leak", [None, 16])
def test_the_authors_log_n_query_scale_is_opt_in_and_matches_their_code(arch, impl, leak):
    base = tiny_model(arch, attn_implementation=impl)
    ids = tokens(3 * L0)
    expected = logits(reference_model(base, rerope_scores, window=16, leak=leak, log_scale=L0), ids)
    patched = hf_posext.patch_model(copy.deepcopy(base), "rerope", window=16, leak=leak, log_scale=True)
    assert (logits(patched, ids) - expected).abs().max() <= 1e-4
    without = logits(reference_model(base, rerope_scores, window=16, leak=leak), ids)
    assert (without - expected).abs().max() > 1e-3  # positions past L0 are scaled


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("leak", [None, 16])
@pytest.mark.parametrize("log_scale", [False, True])
def test_inside_the_window_the_model_is_unchanged_bit_for_bit(impl, leak, log_scale):
    base = tiny_model("llama", attn_implementation=impl)
    ids = tokens(16)
    patched = hf_posext.patch_model(copy.deepcopy(base), "rerope", window=16, leak=leak, log_scale=log_scale)
    assert torch.equal(logits(patched, ids), logits(base, ids))


def test_defaults_are_the_authors():
    assert ReRopeConfig().resolve(4096) == 512  # rerope_patch.py: window 512 for Llama-2's 4096
    method = ReRopeConfig(leak=16)
    assert (method.resolve(L0), method.leak) == (8, 16.0)
    model = hf_posext.patch_model(tiny_model("llama"), "rerope", factor=4)
    assert model.config.max_position_embeddings == 4 * L0
    info = hf_posext.patch_info(model)
    assert (info["window"], info["leak"], info["log_scale"]) == (None, None, False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, r"window must be an int >= 1.*got 0"),
        ({"window": -8}, r"window must be an int >= 1.*got -8"),
        ({"window": 8.5}, r"window must be an int >= 1.*got 8.5"),
        ({"leak": 1}, r"leak must be a finite number > 1.*got 1"),
        ({"leak": 0.5}, r"leak must be a finite number > 1.*got 0.5"),
        ({"leak": -4}, r"leak must be a finite number > 1.*got -4"),
        ({"leak": "16"}, r"leak must be a finite number > 1.*got '16'"),
        ({"log_scale": "yes"}, r"log_scale must be True or False.*got 'yes'"),
    ],
)
def test_bad_values_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReRopeConfig(**kwargs)


def test_a_window_of_the_whole_context_raises_before_anything_changes():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match=r"window must be an int in \[1, 64\).*got 64"):
        hf_posext.patch_model(model, "rerope", window=64)
    assert hf_posext.patch_info(model)["method"] is None
    assert model.config._attn_implementation == "eager"
