"""Remapped attention (Self-Extend, DCA, STRING, ReRoPE): KV cache, padding, beams, shipped ropes, reloads, refusals."""

from __future__ import annotations

import copy

import pytest
from scripts import registry
import torch
from tests.helpers.training_free_reference import (
    dca_scores,
    reference_model,
    rerope_scores,
    self_extend_scores,
    string_scores,
)
from tests.helpers.models import tiny_model, tokens

import hf_posext
from hf_posext.attention.remap import attention as remap
from hf_posext.attention.remap import rotate_by
from hf_posext.rope_utils import REMAP_ROPE_TYPE

L0 = 64
METHODS = {
    "self_extend": ({"group_size": 4, "window_size": 16}, self_extend_scores),
    "dca": ({"chunk_size": 48, "local_size": 8}, dca_scores),
    "string": ({"shift": 24, "local_window": 8}, string_scores),
    "rerope": ({"window": 16}, rerope_scores),
    "rerope-leaky": ({"window": 16, "leak": 4}, rerope_scores),
    # the authors' optional scalings (references take L0 for log_scale)
    "string-qk_scale": ({"shift": 24, "local_window": 8, "qk_scale": True}, string_scores),
    "rerope-log_scale": ({"window": 16, "leak": 4, "log_scale": True}, rerope_scores),
}


def patch(model, case):
    """``model`` patched with the method of ``case`` (a key of METHODS: ``name`` or ``name-variant``)."""
    return hf_posext.patch_model(model, case.split("-")[0], **METHODS[case][0])


def reference_arguments(case, patched):
    """The reference's arguments for ``case``; log_scale takes the L0 the patch resolved (a composed rope's reach)."""
    kwargs = dict(METHODS[case][0])
    if kwargs.get("log_scale"):
        kwargs["log_scale"] = patched.config.hf_posext["original_max_position_embeddings"]
    return kwargs


#: The registered names of the remapping methods.
NAMES = sorted({case.split("-")[0] for case in METHODS})


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits


def test_rotate_by_composes_rotations_in_fp32():
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16)
    x = torch.randn(2, 3, 5, 20)
    positions = torch.arange(5).expand(2, 5)
    once = rotate_by(x, positions + 7, inv_freq)
    twice = rotate_by(rotate_by(x, positions, inv_freq), torch.full((2, 5), 7), inv_freq)
    torch.testing.assert_close(twice, once, rtol=0, atol=1e-5)
    assert torch.equal(once[..., 16:], x[..., 16:])  # channels past rotary_dim pass through


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_fused_cpu_path_equals_the_score_matrix_path(method, monkeypatch):
    model = patch(tiny_model("llama", attn_implementation="sdpa"), method)
    ids = tokens(3 * L0)
    calls = []
    fused = remap.flash_segmented_attention
    monkeypatch.setattr(remap, "flash_segmented_attention", lambda *a: calls.append(1) or fused(*a))
    expected = logits(model, ids)
    assert calls  # an unpadded sdpa forward takes the fused path
    monkeypatch.setattr(remap, "flash_available", lambda *a: False)
    torch.testing.assert_close(logits(model, ids), expected, rtol=0, atol=1e-5)


@pytest.mark.newest
@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_cached_greedy_generation_equals_full_forward_at_every_step(method, impl):
    model = patch(tiny_model("llama", attn_implementation=impl), method)
    prompt = tokens(100)
    out = model.generate(prompt, max_new_tokens=40, do_sample=False, output_logits=True, return_dict_in_generate=True)
    for step, step_logits in enumerate(out.logits):
        full = logits(model, out.sequences[:, : prompt.shape[1] + step])[:, -1]
        assert (step_logits - full).abs().max() <= 1e-4, step


@pytest.mark.parametrize("method", sorted(METHODS))
def test_left_padded_batches_equal_the_rows_alone(method):
    model = patch(tiny_model("llama", attn_implementation="sdpa"), method)
    model.generation_config.pad_token_id = 0
    long, short = tokens(150, seed=2), tokens(110, seed=3)
    pad = long.shape[1] - short.shape[1]
    batch = torch.cat((long, torch.cat((torch.zeros(1, pad, dtype=torch.long), short), dim=1)))
    mask = torch.ones_like(batch)
    mask[1, :pad] = 0
    together = model.generate(
        batch, attention_mask=mask, max_new_tokens=12, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    for row, ids in enumerate((long, short)):
        alone = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        assert torch.equal(together.sequences[row, -12:], alone.sequences[0, -12:])
        for step in range(12):
            assert (together.logits[step][row] - alone.logits[step][0]).abs().max() <= 1e-4


def _loss_gradients(model, ids, mask):
    model.zero_grad()
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)  # no token predicted from a padding row
    model(ids, attention_mask=mask, labels=labels).loss.backward()
    return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_training_gradients_equal_the_float64_references(method, impl, padded):
    """Autograd through the masked path (every padded batch; every step on a GPU) and the unpadded CPU path.

    The fused CPU kernel's backward ignores the gradient of its log-sum-exp, which the merge of
    the pieces needs: training must not take it (its gradients were 37% off).
    """
    base = tiny_model("llama", attn_implementation=impl)
    model = patch(copy.deepcopy(base), method).train()
    reference = reference_model(base, METHODS[method][1], **reference_arguments(method, model)).train()
    ids = tokens(130, batch=2, seed=4)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :30] = 0  # left padding: the remapping's masked path
    got = _loss_gradients(model, ids, mask)
    expected = _loss_gradients(reference, ids, mask)
    assert got.keys() == expected.keys() and got
    for name, grad in expected.items():
        assert torch.isfinite(got[name]).all(), name
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_pose_positions_are_remapped_from_the_positions_given(method, impl):
    """PoSE's skip-wise positions [0..31, 200..231]: the tokens score as at their true positions.

    The reference is the same model on a 232-token sequence holding the tokens at those
    positions, the skipped ones masked out (plain RoPE agrees to ~1e-7 here).
    """
    model = patch(tiny_model("llama", attn_implementation=impl), method)
    ids = tokens(64, batch=2, seed=5)
    positions = torch.cat((torch.arange(32), torch.arange(200, 232)))[None].expand(2, -1)
    with torch.no_grad():
        got = model(ids, position_ids=positions, attention_mask=torch.ones_like(ids), use_cache=False).logits
        full = torch.zeros(2, 232, dtype=torch.long)
        full[:, positions[0]] = ids
        mask = torch.zeros_like(full)
        mask[:, positions[0]] = 1
        expected = model(
            full, position_ids=torch.arange(232)[None].expand(2, -1), attention_mask=mask, use_cache=False
        ).logits[:, positions[0]]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_positions_that_jump_after_a_cache_are_refused(method):
    model = patch(tiny_model("llama", attn_implementation="sdpa"), method)
    with torch.no_grad():
        cache = model(tokens(100), use_cache=True).past_key_values
        with pytest.raises(ValueError, match=r"position_ids that jump .* after cached keys"):
            model(
                tokens(8),
                position_ids=torch.tensor([[100, 101, 102, 103, 150, 151, 152, 153]]),
                cache=cache,
                attention_mask=torch.ones(1, 108, dtype=torch.long),
            )


@pytest.mark.parametrize("method", sorted(METHODS))
def test_beam_search_runs_and_keeps_its_best_beam_consistent(method):
    model = patch(tiny_model("llama"), method)
    out = model.generate(
        tokens(100), max_new_tokens=8, num_beams=3, do_sample=False, output_scores=True, return_dict_in_generate=True
    )
    assert out.sequences.shape == (1, 108)
    scores = torch.log_softmax(logits(model, out.sequences), dim=-1)[0, 99:-1]
    best = scores.gather(-1, out.sequences[0, 100:, None]).sum()
    torch.testing.assert_close(best / 8, out.sequences_scores[0], rtol=0, atol=1e-3)


SHIPPED = {
    "raised theta": {"rope_type": "default", "rope_theta": 500000.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 2.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 32},
}


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("shipped", sorted(SHIPPED))
def test_runs_on_top_of_a_shipped_rope_with_its_attention_factor_once(method, shipped):
    base = tiny_model("llama", rope_parameters=SHIPPED[shipped])
    ids = tokens(3 * L0)
    patched = patch(copy.deepcopy(base), method)
    # the shipped rope under the remapping's rope type (vanilla transformers' second guard), same frequencies
    assert patched.config.rope_parameters == {
        **base.config.rope_parameters,
        "rope_type": REMAP_ROPE_TYPE,
        "remapped_rope_type": SHIPPED[shipped]["rope_type"],
    }
    assert torch.equal(patched.model.rotary_emb.inv_freq, base.model.rotary_emb.inv_freq)
    assert patched.model.rotary_emb.attention_scaling == base.model.rotary_emb.attention_scaling
    expected = logits(reference_model(base, METHODS[method][1], **reference_arguments(method, patched)), ids)
    assert (logits(patched, ids) - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("method", sorted(METHODS))
def test_runs_on_top_of_a_composed_longrope(method):
    base = hf_posext.patch_model(tiny_model("llama", rope_parameters=SHIPPED["yarn"]), "yarn", factor=2)
    composed = copy.deepcopy(base.config.rope_parameters)
    assert composed["rope_type"] == "longrope"
    checkpoint = tiny_model("llama", rope_parameters=composed, max_positions=base.config.max_position_embeddings)
    ids = tokens(3 * L0)
    patched = patch(copy.deepcopy(checkpoint), method)
    expected = logits(reference_model(checkpoint, METHODS[method][1], **reference_arguments(method, patched)), ids)
    assert (logits(patched, ids) - expected).abs().max() <= 1e-4


def attention_maps(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, output_attentions=True, **kwargs).attentions


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_output_attentions_returns_the_maps_of_the_methods_own_scores(method, impl, padded):
    """One map per layer, the float64 reference's softmax: unpadded sdpa would take the fused path, which has none."""
    base = tiny_model("llama", attn_implementation=impl)
    model = patch(copy.deepcopy(base), method)
    reference = reference_model(base, METHODS[method][1], **reference_arguments(method, model))
    ids = tokens(130, batch=2, seed=4)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :30] = 0
    got, want = attention_maps(model, ids, attention_mask=mask), attention_maps(reference, ids, attention_mask=mask)
    assert len(got) == len(want) == model.config.num_hidden_layers
    for layer, (maps, expected) in enumerate(zip(got, want)):
        assert maps.shape == (2, 4, 130, 130) and maps.dtype == torch.float32, layer
        # the rows of padding queries attend to no key: their uniform rows are no token's business (not compared)
        real = mask[:, :, None, None].transpose(1, 2).bool().expand_as(maps)
        torch.testing.assert_close(maps[real], expected[real], rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_output_attentions_of_a_cached_step_and_of_packed_sequences_are_the_full_forwards_rows(method, impl):
    model = patch(tiny_model("llama", attn_implementation=impl), method)
    ids = tokens(101, seed=5)
    full = attention_maps(model, ids)
    with torch.no_grad():
        cache = model(ids[:, :-1], use_cache=True).past_key_values
    step = attention_maps(model, ids[:, -1:], past_key_values=cache)
    for layer, maps in enumerate(step):
        torch.testing.assert_close(maps, full[layer][:, :, -1:], rtol=0, atol=1e-5)
    # two sequences packed in one row (position ids restart): each its own maps on its block, zeros between
    first = tokens(L0, seed=6)
    packed = torch.cat((first, ids), dim=1)
    positions = torch.cat((torch.arange(L0), torch.arange(ids.shape[1])))[None]
    together = attention_maps(model, packed, position_ids=positions)
    alone = attention_maps(model, first)
    for layer, maps in enumerate(together):
        torch.testing.assert_close(maps[:, :, :L0, :L0], alone[layer], rtol=0, atol=1e-5)
        torch.testing.assert_close(maps[:, :, L0:, L0:], full[layer], rtol=0, atol=1e-5)
        assert not maps[:, :, L0:, :L0].any()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_unpatch_restores_the_model_bit_for_bit(method):
    base = tiny_model("llama", attn_implementation="sdpa")
    ids = tokens(3 * L0)
    expected = logits(base, ids)
    patched = patch(base, method)
    assert not torch.equal(logits(patched, ids), expected)
    hf_posext.unpatch_model(patched)
    assert patched.config._attn_implementation == "sdpa"
    assert torch.equal(logits(patched, ids), expected)


@pytest.mark.parametrize("method", NAMES)
def test_a_mask_per_query_head_masks_its_own_head(method):
    """Doge's dynamic mask is one additive mask per query head ([batch, heads, seq, keys]): each head's output
    is the one its own mask gives, that head alone (query head h reads kv head h // groups)."""
    model = patch(tiny_model("llama", num_attention_heads=4, num_key_value_heads=2), method)
    module = model.model.layers[0].self_attn
    batch, heads, seq, head_dim = 2, 4, 3 * L0, module.head_dim
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(batch, heads, seq, head_dim, generator=generator)
    key, value = (torch.randn(batch, 2, seq, head_dim, generator=generator) for _ in range(2))
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    mask = torch.randn(batch, heads, seq, seq, generator=generator).masked_fill(~causal, torch.finfo(torch.float32).min)
    kwargs = {"position_ids": torch.arange(seq)[None], "scaling": head_dim**-0.5}
    got, _ = remap.remap_attention(module, query, key, value, mask, **kwargs)
    for head in range(heads):
        kv = slice(head // 2, head // 2 + 1)
        alone, _ = remap.remap_attention(
            module, query[:, head : head + 1], key[:, kv], value[:, kv], mask[:, head : head + 1], **kwargs
        )
        torch.testing.assert_close(got[:, :, head], alone[:, :, 0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_static_cache_is_refused(method):
    model = patch(tiny_model("llama"), method)
    with pytest.raises(ValueError, match="needs a cache that grows"):
        model.generate(tokens(20), max_new_tokens=2, cache_implementation="static")


@pytest.mark.parametrize(
    ("model_type", "message"),
    [
        ("cohere", r"does not rotate channel pairs \(i, i \+ rotary_dim / 2\)"),
        ("deepseek_v3", r"does not support multi-head latent attention"),
    ],
)
@pytest.mark.parametrize("method", NAMES)
def test_interleaved_pairs_and_latent_attention_are_refused_naming_the_architecture(model_type, message, method):
    model = registry.tiny_model(model_type)
    with pytest.raises(ValueError, match=rf"{method} \(model_type='{model_type}'\).*{message}") as error:
        hf_posext.patch_model(model, method)
    assert "exact" not in str(error.value)  # the exact-cache wrapper is the dynamic methods', not theirs
    assert hf_posext.patch_info(model)["method"] is None


@pytest.mark.parametrize("method", [*NAMES, "dynamic_ntk"])
def test_a_model_that_builds_its_rotary_before_its_attention_is_refused(method):
    """HRM-Text builds its rotary first: a reload installs the wrapper when the rotary registers
    (hf_posext/loading.py), which then finds no attention to wrap, so the patch is refused up front."""
    model = registry.tiny_model("hrm_text")
    with pytest.raises(ValueError, match="builds its rotary embedding before its attention modules"):
        hf_posext.patch_model(model, method)
    assert hf_posext.patch_info(model)["method"] is None
    hf_posext.patch_model(model, "dynamic_ntk", exact_cache=False)  # the fallback the message names


@pytest.mark.parametrize("method", NAMES)
def test_a_latent_attention_config_alone_is_refused_too(method):
    config = registry.tiny_config("deepseek_v3")
    with pytest.raises(ValueError, match=rf"{method} \(model_type='deepseek_v3'\).*multi-head latent attention"):
        hf_posext.patch_model(config, method)
    assert not hasattr(config, "hf_posext")
