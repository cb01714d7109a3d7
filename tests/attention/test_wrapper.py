"""``output_attentions=True`` through every attention the package installs, on every kernel it wraps.

The maps come back (one per layer, as eager returns them) or the forward is refused naming why;
never the empty tuple transformers gives for a kernel that returns no weights.
"""

from __future__ import annotations

import copy

import pytest
import torch

import hf_posext
from hf_posext.attention.maps import additive_mask
from hf_posext.methods.alibi import attention as alibi_attention
from tests.helpers.models import tiny_model, tokens

L0 = 64
#: Every registered method, with what it needs for 3 x L0 tokens (learned positions: a table that long).
ARGUMENTS = {"learned": {"max_length": 4 * L0}, "alibi": {}, "sinusoidal": {}}
PADDED = 30

pytestmark = pytest.mark.usefixtures("one_thread")


def patched(method: str, kernel: str, **kwargs):
    arguments = {**ARGUMENTS.get(method, {"factor": 4}), **kwargs}
    return hf_posext.patch_model(tiny_model(attn_implementation=kernel), method, **arguments)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = tokens(3 * L0, batch=2, seed=4)
    mask = torch.ones_like(ids)
    mask[1, :PADDED] = 0
    return ids, mask


def maps_of(model, ids, **kwargs) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return model(ids, output_attentions=True, **kwargs).attentions


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("method", hf_posext.available_methods())
def test_every_method_returns_one_map_per_layer_whose_rows_are_distributions(method, kernel):
    model = patched(method, kernel)
    ids, mask = batch()
    maps = maps_of(model, ids, attention_mask=mask)
    if model.config._attn_implementation == "sdpa":  # a rope method on transformers' own sdpa: as without the plugin
        assert maps == maps_of(tiny_model(attn_implementation="sdpa"), ids, attention_mask=mask) == ()
        return
    assert len(maps) == model.config.num_hidden_layers, (method, kernel)
    for layer in maps:
        assert layer.shape == (2, 4, 3 * L0, 3 * L0)
        real = layer[:, :, PADDED:]  # rows of real tokens in both rows of the batch
        torch.testing.assert_close(real.sum(-1), torch.ones_like(real.sum(-1)), rtol=0, atol=1e-5)
        assert not real.triu(PADDED + 1).any()  # causal: nothing after the query
        assert not layer[1, :, PADDED:, :PADDED].any()  # nothing on left padding


@pytest.mark.parametrize(
    ("method", "arguments"),
    [("dynamic_ntk", {}), ("dynamic_yarn", {}), ("longrope", {"factors_by": "query"}), ("alibi", {})],
    ids=["dynamic_ntk", "dynamic_yarn", "longrope-by-query", "alibi"],
)
def test_the_wrapper_of_sdpa_returns_the_maps_the_wrapper_of_eager_returns(method, arguments):
    """With a cache too: the exact-dynamic decode step and the rotated prefix, ALiBi's cached bias."""
    ids, mask = batch()
    eager, sdpa = patched(method, "eager", **arguments), patched(method, "sdpa", **arguments)
    assert sdpa.config._attn_implementation != "sdpa"  # one of the package's wrappers, not transformers' own
    sdpa.load_state_dict(eager.state_dict())
    got, want = maps_of(sdpa, ids, attention_mask=mask), maps_of(eager, ids, attention_mask=mask)
    assert len(got) == len(want) == sdpa.config.num_hidden_layers
    for layer_sdpa, layer_eager in zip(got, want):
        torch.testing.assert_close(layer_sdpa, layer_eager, rtol=0, atol=1e-5)
    steps = []
    for model in (eager, sdpa):
        with torch.no_grad():
            cache = model(ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True).past_key_values
        steps.append(maps_of(model, ids[:, -1:], attention_mask=mask, past_key_values=cache))
    assert len(steps[0]) == len(steps[1]) == sdpa.config.num_hidden_layers
    for layer_eager, layer_sdpa in zip(*steps):
        assert layer_sdpa.shape == (2, 4, 1, 3 * L0)
        torch.testing.assert_close(layer_sdpa, layer_eager, rtol=0, atol=1e-5)


def test_output_attentions_set_in_the_config_is_honoured_too():
    # transformers refuses config.output_attentions = True unless the attention is "eager": set before patching
    model = tiny_model(attn_implementation="eager")
    model.config.output_attentions = True
    hf_posext.patch_model(model, "string", factor=4)
    ids, mask = batch()
    with torch.no_grad():
        maps = model(ids, attention_mask=mask).attentions
    assert len(maps) == model.config.num_hidden_layers


@pytest.mark.parametrize("backend", ["folded", "flex"])
def test_alibi_paths_that_hold_no_maps_refuse_naming_the_backend(backend, monkeypatch):
    monkeypatch.setattr(alibi_attention, "FLEX_COMPILE", False)
    model = patched("alibi", "sdpa", backend=backend)
    ids, mask = batch()
    with pytest.raises(ValueError, match=f"ALiBi backend '{backend}' computes no attention maps.*backend='eager' or"):
        maps_of(model, ids, attention_mask=mask)
    with torch.no_grad():
        assert model(ids, attention_mask=mask).attentions is None  # without the request it runs as before


def test_additive_mask_turns_sdpa_masks_into_eagers():
    query, key = torch.zeros(1, 2, 3, 4), torch.zeros(1, 1, 5, 4)
    lowest = torch.finfo(torch.float32).min
    causal = additive_mask(None, query, key)  # the queries are the last three of five positions
    expected = torch.tensor([[0, 0, 0, lowest, lowest], [0, 0, 0, 0, lowest], [0, 0, 0, 0, 0]])
    assert torch.equal(causal[0, 0], expected)
    boolean = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    boolean[..., 0] = False
    assert torch.equal(additive_mask(boolean, query, key)[0, 0, :, 0], torch.full((3,), lowest))
    floating = torch.randn(1, 1, 3, 5)
    assert additive_mask(floating, query, key) is floating
    half = additive_mask(boolean, query.to(torch.bfloat16), key)
    assert half.dtype == torch.bfloat16 and half[0, 0, 0, 0] == torch.finfo(torch.bfloat16).min


def test_without_the_request_the_sdpa_wrappers_still_run_sdpa(monkeypatch):
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    model = patched("dynamic_yarn", "sdpa")
    ids, mask = batch()
    with torch.no_grad():
        model(ids[:, :L0], attention_mask=mask[:, :L0])
    assert calls
    calls.clear()
    maps_of(copy.deepcopy(model), ids[:, :L0], attention_mask=mask[:, :L0])
    assert not calls
