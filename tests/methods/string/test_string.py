"""STRING: config validation, the authors' defaults, parity with a float64 relative-position reference."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.helpers.training_free_reference import reference_model, relative_scores, string_scores
from tests.helpers.models import tiny_model, tokens

import hf_posext
from hf_posext.attention.remap import attention as remap
from hf_posext.attention.remap import flash_segments
from hf_posext.methods.string import StringConfig

L0 = 64


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_the_relative_reference_with_true_distances_is_the_model():
    base = tiny_model("llama")
    ids = tokens(3 * L0)
    identity = reference_model(base, lambda q, k, inv, f, g: relative_scores(q, k, inv, f, g, lambda d: d))
    assert (logits(identity, ids) - logits(base, ids)).abs().max() <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("block_elements", [remap.BLOCK_ELEMENTS, 4 * 192 * 7])
@pytest.mark.parametrize(("shift", "local_window"), [(24, 8), (40, 1)])
def test_matches_the_authors_float64_reference_at_3x(arch, impl, block_elements, shift, local_window, monkeypatch):
    monkeypatch.setattr(remap, "BLOCK_ELEMENTS", block_elements)
    monkeypatch.setattr(
        flash_segments, "FLASH_BLOCK", block_elements // (4 * 192)
    )  # 7-row blocks: every piece boundary is crossed
    base = tiny_model(arch, attn_implementation=impl)
    ids = tokens(3 * L0)
    expected = logits(reference_model(base, string_scores, shift=shift, local_window=local_window), ids)
    patched = hf_posext.patch_model(copy.deepcopy(base), "string", shift=shift, local_window=local_window)
    assert (logits(patched, ids) - expected).abs().max() <= 1e-4
    assert (logits(base, ids) - expected).abs().max() > 1e-2  # the remapping shows in the logits


def test_the_key_at_distance_shift_is_scored_at_the_local_window():
    """The authors' decode path (their prefill window, inclusive at both ends, counts it twice)."""
    base = tiny_model("llama")
    ids = tokens(25)  # one pair at d = S = 24
    patched = hf_posext.patch_model(copy.deepcopy(base), "string", shift=24, local_window=8)
    expected = logits(reference_model(base, string_scores, shift=24, local_window=8), ids)
    assert (logits(patched, ids) - expected).abs().max() <= 1e-4
    assert not torch.equal(logits(patched, ids), logits(base, ids))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("length", [20, 3 * L0])
def test_the_authors_qk_scale_is_opt_in_and_matches_their_code(arch, impl, length):
    base = tiny_model(arch, attn_implementation=impl)
    ids = tokens(length)
    expected = logits(reference_model(base, string_scores, shift=24, local_window=8, qk_scale=True), ids)
    patched = hf_posext.patch_model(copy.deepcopy(base), "string", shift=24, local_window=8, qk_scale=True)
    assert (logits(patched, ids) - expected).abs().max() <= 1e-4
    without = logits(reference_model(base, string_scores, shift=24, local_window=8), ids)
    assert (without - expected).abs().max() > 1e-3  # the scale applies at every length, as theirs


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_inside_the_shift_the_model_is_unchanged_bit_for_bit(impl):
    base = tiny_model("llama", attn_implementation=impl)
    ids = tokens(24)
    patched = hf_posext.patch_model(copy.deepcopy(base), "string", shift=24, local_window=8)
    assert torch.equal(logits(patched, ids), logits(base, ids))


def test_defaults_are_the_authors():
    assert StringConfig().resolve(8192) == (int(0.33 * 8192), 128)  # README: S = 0.33 L, W = 128
    assert StringConfig().resolve(L0) == (21, 10)  # W capped at S // 2 for tiny contexts
    model = hf_posext.patch_model(tiny_model("llama"), "string")
    assert model.config.max_position_embeddings == L0  # a method for the trained window
    assert model.config.string_config == {"shifted_offset": 21, "local_value": 10}
    assert hf_posext.patch_info(model)["qk_scale"] is False
    assert hf_posext.patch_model(tiny_model("llama"), "string", factor=2).config.max_position_embeddings == 2 * L0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shift": 0}, r"shift must be an int >= 1.*got 0"),
        ({"shift": -3}, r"shift must be an int >= 1.*got -3"),
        ({"shift": 2.5}, r"shift must be an int >= 1.*got 2.5"),
        ({"local_window": 0}, r"local_window must be an int >= 1.*got 0"),
        ({"local_window": -1}, r"local_window must be an int >= 1.*got -1"),
        ({"shift": 8, "local_window": 8}, r"local_window must be below shift=8.*got 8"),
        ({"qk_scale": 2}, r"qk_scale must be True or False.*got 2"),
    ],
)
def test_bad_values_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StringConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shift": 64, "local_window": 8}, r"shift must be an int in \[2, 64\).*got 64"),
        ({"local_window": 30}, r"local_window must be an int in \[1, 21\) \(below shift=21\).*got 30"),
    ],
)
def test_values_out_of_range_for_the_model_raise_before_anything_changes(kwargs, message):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match=message):
        hf_posext.patch_model(model, "string", **kwargs)
    assert hf_posext.patch_info(model)["method"] is None
    assert model.config._attn_implementation == "eager"
    assert not hasattr(model.config, "string_config")


def test_unpatch_removes_the_engine_field():
    model = hf_posext.patch_model(tiny_model("llama"), "string")
    hf_posext.unpatch_model(model)
    assert not hasattr(model.config, "string_config")
    assert model.config._attn_implementation == "eager"
