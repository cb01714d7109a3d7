"""hf_posext.from_pretrained: saved patched checkpoints come back with their method's surgery.

Real save_pretrained / from_pretrained round trips of tiny models; no Hub.
"""

from __future__ import annotations

import pytest
import torch
from tests.helpers.models import tiny_model, tokens
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.loading import set_construction_hook

# every method with a surgery, plus one RoPE-only method
CASES = {
    "learned": {"max_length": 48},
    "sinusoidal": {},
    "alibi": {},
    "dynamic_yarn": {"factor": 4},
    "dynamic_ntk": {"factor": 4, "exact_cache": False},
    "yarn": {"factor": 4},
    "self_extend": {"group_size": 4, "window_size": 8},
    "dca": {},
    "string": {"shift": 6, "local_window": 2},
    "rerope": {"window": 4, "leak": 16},
    "longrope": {"factor": 4},
}


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.newest
@pytest.mark.parametrize("method", sorted(CASES))
def test_from_pretrained_reloads_identical_logits(method, tmp_path):
    model = hf_posext.patch_model(tiny_model(max_positions=16, attn_implementation="sdpa"), method, **CASES[method])
    ids = tokens(40, batch=2)
    expected = logits(model, ids)
    model.save_pretrained(tmp_path)
    loaded = hf_posext.from_pretrained(tmp_path, attn_implementation="sdpa")
    assert hf_posext.patch_info(loaded)["method"] == method
    torch.testing.assert_close(logits(loaded, ids), expected, rtol=0, atol=1e-6)


def test_the_auto_style_loader_is_from_pretrained(tmp_path):
    hf_posext.patch_model(tiny_model(max_positions=16), "learned", max_length=48).save_pretrained(tmp_path)
    loaded = hf_posext.AutoPatchedModelForCausalLM.from_pretrained(tmp_path)
    assert hf_posext.patched_method(loaded) == hf_posext.LearnedConfig(
        max_length=48, original_max_position_embeddings=16
    )
    with pytest.raises(TypeError, match="from_pretrained"):
        hf_posext.AutoPatchedModelForCausalLM()


def test_every_surgery_method_is_covered():
    assert {m for m in hf_posext.available_methods() if hf_posext.needs_surgery(m)} <= set(CASES)


@pytest.mark.parametrize("method", ["learned", "alibi", "dynamic_yarn"])
def test_without_the_construction_hook_the_loader_refuses_rather_than_returning_a_wrong_model(method, tmp_path):
    hf_posext.patch_model(tiny_model(max_positions=16), method, **CASES[method]).save_pretrained(tmp_path)
    set_construction_hook(False)
    try:
        with pytest.raises(RuntimeError, match=f"patched with {method!r}"):
            hf_posext.from_pretrained(tmp_path, attn_implementation="sdpa")
    finally:
        set_construction_hook(True)
    assert hf_posext.patch_info(hf_posext.from_pretrained(tmp_path))["method"] == method


def test_an_unpatched_checkpoint_loads_as_transformers_loads_it(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    ids = tokens(10)
    ours, theirs = hf_posext.from_pretrained(tmp_path), AutoModelForCausalLM.from_pretrained(tmp_path)
    assert hf_posext.patch_info(ours)["method"] is None
    assert torch.equal(logits(ours, ids), logits(theirs, ids))
