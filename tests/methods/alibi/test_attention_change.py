"""Changing the attention implementation after a patch never silently drops the method (issue 24, item 4).

Every method either keeps giving the same outputs on the new implementation (RoPE methods, absolute
encodings: their surgery does not depend on it) or refuses to run with an error that says what to do
(ALiBi and exact dynamic scaling, whose surgery is the attention path).
"""

from __future__ import annotations

import copy

import pytest
import torch
from tests.helpers.models import tiny_model, tokens
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.methods import method_class

L_ORIG = 32


def patched(method, implementation="eager"):
    factor = 2 if method_class(method).takes_factor else 1
    model = tiny_model(max_positions=L_ORIG, attn_implementation=implementation)
    return hf_posext.patch_model(model, method, factor=factor)


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("method", hf_posext.available_methods())
def test_every_method_keeps_its_path_or_refuses(method, implementation):
    model = patched(method, "eager" if implementation == "sdpa" else "sdpa")
    ids = tokens(L_ORIG)  # within a learned table's rows
    before = logits(model, ids)
    model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == implementation
    try:
        after = logits(model, ids)
    except ValueError as error:
        assert f"attn_implementation was changed to {implementation!r}" in str(error)
        assert "patch_model" in str(error)
        return
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_alibi_refuses_a_changed_attention_after_reload_and_copy_and_not_after_unpatch(tmp_path):
    model = patched("alibi")
    model.save_pretrained(tmp_path)
    ids = tokens(8)
    for candidate in (AutoModelForCausalLM.from_pretrained(tmp_path), copy.deepcopy(model)):
        candidate.set_attn_implementation("sdpa")
        with pytest.raises(ValueError, match="attn_implementation was changed to 'sdpa'"):
            candidate(ids)
    hf_posext.unpatch_model(model)
    model.set_attn_implementation("sdpa")
    model(ids)  # plain RoPE again: nothing to refuse
    hf_posext.patch_model(model, "alibi")
    assert torch.equal(logits(model, ids), logits(patched("alibi"), ids))
