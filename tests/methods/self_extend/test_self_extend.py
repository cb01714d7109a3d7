"""Self-Extend: config validation, the reach formula, and parity with LongLM's float64 selection merge."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.helpers.training_free_reference import reference_model, self_extend_scores
from tests.helpers.models import tiny_model, tokens

import hf_posext
from hf_posext.attention.remap import attention as remap
from hf_posext.attention.remap import flash_segments
from hf_posext.methods.self_extend import SelfExtendConfig

L0 = 64


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("block_elements", [remap.BLOCK_ELEMENTS, 4 * 192 * 7])
def test_matches_longlm_float64_reference_at_3x(arch, impl, block_elements, monkeypatch):
    monkeypatch.setattr(remap, "BLOCK_ELEMENTS", block_elements)
    monkeypatch.setattr(
        flash_segments, "FLASH_BLOCK", block_elements // (4 * 192)
    )  # 7-row blocks: every piece boundary is crossed
    base = tiny_model(arch, attn_implementation=impl)
    ids = tokens(3 * L0)
    expected = logits(reference_model(base, self_extend_scores, group_size=4, window_size=16), ids)
    patched = hf_posext.patch_model(copy.deepcopy(base), "self_extend", group_size=4, window_size=16)
    assert (logits(patched, ids) - expected).abs().max() <= 1e-4
    assert (logits(base, ids) - expected).abs().max() > 1e-2  # the remapping shows in the logits


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_inside_the_window_the_model_is_unchanged_bit_for_bit(impl):
    base = tiny_model("llama", attn_implementation=impl)
    ids = tokens(16)
    patched = hf_posext.patch_model(copy.deepcopy(base), "self_extend", group_size=4, window_size=16)
    assert torch.equal(logits(patched, ids), logits(base, ids))


def test_group_size_one_is_the_model():
    base = tiny_model("llama")
    ids = tokens(3 * L0)
    patched = hf_posext.patch_model(copy.deepcopy(base), "self_extend", group_size=1, window_size=16)
    assert torch.equal(logits(patched, ids), logits(base, ids))


@pytest.mark.parametrize(
    ("kwargs", "group", "window"),
    [
        ({"factor": 2}, 3, 16),  # W = L0 // 4, G = ceil((2 L0 - W) / (L0 - W))
        ({"factor": 4}, 5, 16),
        ({"factor": 4, "window_size": 32}, 7, 32),
        ({"factor": 2, "group_size": 4}, 4, 42),  # W = (G - s) L0 / (G - 1)
        ({"group_size": 8, "window_size": 8}, 8, 8),
    ],
)
def test_group_and_window_follow_the_reach_formula(kwargs, group, window):
    method = SelfExtendConfig(**kwargs)
    assert method.resolve(L0) == (group, window)
    assert method.reach(L0) == (L0 - window) * group + window >= method.factor * L0


def test_patched_config_advertises_the_reach():
    model = hf_posext.patch_model(tiny_model("llama"), "self_extend", group_size=4, window_size=16)
    assert model.config.max_position_embeddings == (L0 - 16) * 4 + 16
    assert hf_posext.patch_info(model)["group_size"] == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_size": 0}, r"group_size must be an int >= 1.*got 0"),
        ({"group_size": 2.5}, r"group_size must be an int >= 1.*got 2.5"),
        ({"group_size": 2.0}, r"group_size must be an int >= 1.*got 2.0"),
        ({"window_size": "8"}, r"window_size must be an int >= 1.*got '8'"),
        ({"factor": 2, "group_size": 4, "window_size": 8}, r"not all three"),
    ],
)
def test_bad_values_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SelfExtendConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_size": 4, "window_size": 64}, r"window_size must be an int in \[1, 64\).*got 64"),
        ({"factor": 4, "group_size": 3}, r"group_size=3 must exceed factor=4.0"),
    ],
)
def test_values_out_of_range_for_the_model_raise_before_anything_changes(kwargs, message):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match=message):
        hf_posext.patch_model(model, "self_extend", **kwargs)
    assert hf_posext.patch_info(model)["method"] is None
    assert model.config._attn_implementation == "eager"
