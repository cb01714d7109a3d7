"""Exact dynamic scaling with a KV cache (hf_posext.attention.exact_dynamic).

References: transformers' own full forward (the same as hf-posext's definition at the last
position of a one-layer model), a slow per-row loop written from the definition below, and
the property that cached decoding equals a forward pass at every step.

Definition under test: the token at position i attends with the frequencies for length i + 1;
its query and every key it attends to are rotated with them.
"""

from __future__ import annotations

import copy
import json
import math
import threading

import pytest
import torch
from tests.helpers.models import tiny_model, tokens
from transformers import AutoModelForCausalLM, StaticCache, modeling_rope_utils
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

import hf_posext
from hf_posext.attention import exact_dynamic
from hf_posext.attention.exact_dynamic import attention as exact_attention
from hf_posext.attention.exact_dynamic import rowwise as exact_rowwise
from hf_posext.attention.exact_dynamic.forward_plan import STATE_ATTR

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
METHODS = ("dynamic_ntk", "dynamic_yarn")
L_ORIG = 16  # tiny original context: 3x is 48 tokens (mistral's sliding window is 32)
FACTOR = 4
TOL = 2e-5  # fp32: measured differences are ~5e-7; native's stale keys are >1e-2 off


pytestmark = pytest.mark.usefixtures("one_thread")


def patched(arch="llama", method="dynamic_yarn", exact_cache=True, **kwargs):
    model = tiny_model(arch, max_positions=L_ORIG, **kwargs)
    return hf_posext.patch_model(model, method, factor=FACTOR, exact_cache=exact_cache)


@torch.no_grad()
def cached_step_logits(model, ids, prompt):
    """Logits of every decoding step: a ``prompt``-token prefill, then one token at a time with the cache.

    Returns ``[batch, seq - prompt + 1, vocab]``: row t predicts token ``prompt + t``.
    """
    out = model(ids[:, :prompt], use_cache=True)
    cache, steps = out.cache, [out.logits[:, -1]]
    for t in range(prompt, ids.shape[1]):
        out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
        cache = out.cache
        steps.append(out.logits[:, -1])
    return torch.stack(steps[:-1], dim=1)


@torch.no_grad()
def prefix_logits(model, ids, length):
    return model(ids[:, :length], use_cache=False).logits[:, -1]


@pytest.mark.newest
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ARCHS)
def test_cached_decoding_equals_full_forward_to_3x(arch, method):
    model = patched(arch, method)
    ids = tokens(3 * L_ORIG)
    prompt = 4
    steps = cached_step_logits(model, ids, prompt)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits[:, prompt - 1 : -1]
    # Causal definition: one forward over all 3x tokens holds every step's full-forward logits ...
    torch.testing.assert_close(steps, full, rtol=0, atol=TOL)
    # ... and each of its rows is the last row of a forward over that prefix alone.
    for length in (L_ORIG - 1, L_ORIG + 1, 2 * L_ORIG + 3, 3 * L_ORIG - 1):
        torch.testing.assert_close(steps[:, length - prompt], prefix_logits(model, ids, length), rtol=0, atol=TOL)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ARCHS)
def test_native_dynamic_cache_is_not_exact(arch, method):
    # Why this feature exists (transformers issue 25104): transformers rotates each key once,
    # with the scale of the step that produced it, so past L_orig its cache holds stale keys and
    # cached decoding no longer equals the forward pass over the same prefix.
    # The references come from a second model, lengths in increasing order: transformers' rotary
    # module is stateful (it only grows, and its reset below L_orig keeps YaRN's grown mscale).
    reference = patched(arch, method, exact_cache=False)
    ids = tokens(3 * L_ORIG)
    lengths = (L_ORIG - 1, 2 * L_ORIG + 3, 3 * L_ORIG - 1)
    expected = {length: prefix_logits(reference, ids, length) for length in lengths}
    prompt = 4
    steps = cached_step_logits(patched(arch, method, exact_cache=False), ids, prompt)
    gaps = {length: (steps[:, length - prompt] - expected[length]).abs().max().item() for length in lengths}
    assert gaps[L_ORIG - 1] < TOL  # still exact while no scaling happened
    assert gaps[2 * L_ORIG + 3] > 100 * TOL and gaps[3 * L_ORIG - 1] > 100 * TOL, gaps


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_one_layer_equals_transformers_full_forward(arch, method):
    # With one layer nothing but the rotation depends on the scale, so the last position of
    # transformers' own full forward (its rope functions, its mscale) is the reference.
    exact = patched(arch, method, layers=1)
    native = patched(arch, method, exact_cache=False, layers=1)
    ids = tokens(3 * L_ORIG)
    steps = cached_step_logits(exact, ids, 4)
    for length in (L_ORIG - 2, L_ORIG + 1, 2 * L_ORIG, 3 * L_ORIG - 1):
        torch.testing.assert_close(steps[:, length - 4], prefix_logits(native, ids, length), rtol=0, atol=TOL)


def slow_attention(rope, query, key, value, positions, padding, scaling):
    """The definition, one query row at a time, with transformers' rope function and rotation.

    Channels past ``rope.rotary_dim`` are passed through, as transformers' partial-rotary models do.
    """
    init = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope.rope_type]
    dim = rope.rotary_dim
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out = torch.zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3])
    for b in range(query.shape[0]):
        for i in range(query.shape[2]):
            if not padding[b, i]:
                continue
            inv_freq, factor = init(rope.config, None, seq_len=int(positions[b, i]) + 1)
            angles = positions[b, : i + 1, None].float() * inv_freq
            emb = torch.cat((angles, angles), dim=-1)
            cos, sin = (emb.cos() * factor)[None], (emb.sin() * factor)[None]
            q, k = query[b : b + 1, :, : i + 1], key[b : b + 1, :, : i + 1]
            q_rot, k_rot = apply_rotary_pos_emb(q[..., :dim], k[..., :dim], cos, sin)
            q, k = torch.cat((q_rot, q[..., dim:]), dim=-1), torch.cat((k_rot, k[..., dim:]), dim=-1)
            scores = (q[0, :, i : i + 1] @ k[0].transpose(-1, -2)) * scaling
            scores = scores.masked_fill(~padding[b, : i + 1], float("-inf"))
            out[b, i] = (scores.softmax(-1) @ value[b, :, : i + 1])[:, 0]
    return out


def attention_inputs(dtype, layout="left-padded"):
    """Two batch rows of 3x L_orig tokens for one attention layer: ``(query, key, value, positions, padding)``.

    4 query heads, 2 KV heads, head_dim 32. ``layout``: row 1 left-padded by 5 (masked keys at
    position 0), ``"contiguous"`` positions, or a ``"gap"`` of 7 positions among attended keys
    (e.g. PoSE's skipped positions).
    """
    generator = torch.Generator().manual_seed(0)
    seq = 3 * L_ORIG
    query = torch.randn(2, 4, seq, 32, generator=generator, dtype=dtype)
    key, value = (torch.randn(2, 2, seq, 32, generator=generator, dtype=dtype) for _ in range(2))
    padding = torch.ones(2, seq, dtype=torch.bool)
    padding[1, :5] = layout != "left-padded"
    positions = (padding.long().cumsum(-1) - 1).clamp(min=0)
    if layout == "gap":
        positions[:, 20:] += 7
    return query, key, value, positions, padding


def partial_rotary(model, attention):
    """Give ``attention`` an ExactDynamicRope that rotates half of each head's channels.

    Llama/Mistral/Qwen attention rotates every channel, so partial rotary (written for the rope
    functions that support it) is checked at the attention function.
    """
    config = copy.deepcopy(model.config)
    config.rope_parameters["partial_rotary_factor"] = 0.5
    rope = exact_dynamic.ExactDynamicRope(
        config, config._attn_implementation.removeprefix(exact_dynamic.ATTENTION_PREFIX)
    )
    assert rope.rotary_dim == 16
    setattr(attention, STATE_ATTR, rope)
    return rope


# key positions contiguous (grid tables), with a gap among attended keys, or left-padded (masked keys at position 0)
@pytest.mark.parametrize("layout", ("contiguous", "gap", "left-padded"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))  # fp32: complex rotation; others: real
@pytest.mark.parametrize("rowwise", ("batched", "by kernel"))
@pytest.mark.parametrize("rotary", ("full", "partial"))
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kernel", ("eager", "sdpa"))
def test_multi_row_attention_matches_slow_reference(method, kernel, rotary, rowwise, dtype, layout, monkeypatch):
    model = patched(method=method, attn_implementation=kernel)
    attention = model.model.layers[0].self_attn
    rope = getattr(attention, STATE_ATTR) if rotary == "full" else partial_rotary(model, attention)
    if rowwise == "by kernel":
        monkeypatch.setattr(exact_attention, "attend_rowwise", exact_rowwise.attend_rowwise_by_kernel)
    query, key, value, positions, padding = attention_inputs(dtype, layout)
    seq, dim = query.shape[2], query.shape[3]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    allowed = causal[None] & padding[:, None, :]
    mask = torch.zeros(2, 1, seq, seq, dtype=dtype).masked_fill(~allowed[:, None], torch.finfo(dtype).min)
    plan = rope.plan(positions, batch=2)
    assert plan.calls and plan.rowwise is not None  # rows up to L_orig share a call, later ones go row-wise
    out, weights = exact_dynamic.exact_dynamic_attention(
        attention, query, key, value, mask, scaling=dim**-0.5, position_ids=positions
    )
    assert out.dtype == dtype
    expected = slow_attention(rope, query.float(), key.float(), value.float(), positions, padding, dim**-0.5)
    torch.testing.assert_close(out[padding].float(), expected[padding], rtol=0, atol=1e-5)
    if kernel == "eager":  # the weights are reassembled from both paths: every real row sums to 1
        sums = weights.sum(-1).transpose(1, 2)[padding]
        torch.testing.assert_close(sums, torch.ones_like(sums))
    # sdpa's "plain causal" mask is None: the rows are sliced, so the wrapper must build it.
    if kernel == "sdpa":
        out, _ = exact_dynamic.exact_dynamic_attention(
            attention, query[:1], key[:1], value[:1], None, scaling=dim**-0.5, position_ids=positions[:1]
        )
        torch.testing.assert_close(out[0].float(), expected[0], rtol=0, atol=1e-5)


def decoding_mask(padding, dtype):
    """The additive mask of one query row per batch row against all keys: ``[batch, 1, 1, keys]``."""
    return torch.zeros(padding.shape[0], 1, 1, padding.shape[1], dtype=dtype).masked_fill(
        ~padding[:, None, None], torch.finfo(dtype).min
    )


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
@pytest.mark.parametrize("method", METHODS)
def test_decoding_step_matches_slow_reference(method, dtype):
    # A decoding step leaves the query as it is and turns each key by its offset to it
    # ((j - p) theta', times mscale^2); the reference rotates both by position. The rows have
    # different lengths, so different frequencies. fp32 rotates with a complex multiply, other
    # dtypes with the real rotation.
    model = patched(method=method, attn_implementation="sdpa")
    attention = model.model.layers[0].self_attn
    rope = getattr(attention, STATE_ATTR)
    query, key, value, positions, padding = attention_inputs(dtype)
    mask = decoding_mask(padding, dtype)
    out, _ = exact_dynamic.exact_dynamic_attention(
        attention, query[:, :, -1:], key, value, mask, scaling=32**-0.5, position_ids=positions[:, -1:]
    )
    expected = slow_attention(rope, query.float(), key.float(), value.float(), positions, padding, 32**-0.5)
    assert out.dtype == dtype
    torch.testing.assert_close(out[:, 0].float(), expected[:, -1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_decoding_step_leaves_channels_past_rotary_dim_alone(dtype):
    model = patched(method="dynamic_yarn", attn_implementation="sdpa")
    attention = model.model.layers[0].self_attn
    rope = partial_rotary(model, attention)
    query, key, value, positions, padding = attention_inputs(dtype)
    mask = decoding_mask(padding, dtype)
    out, _ = exact_dynamic.exact_dynamic_attention(
        attention, query[:, :, -1:], key, value, mask, scaling=32**-0.5, position_ids=positions[:, -1:]
    )
    # reference: rotate the first 16 channels of the query and the keys by position, per row
    expected = []
    for b in range(2):
        inv_freq, mscale = rope.frequencies(int(positions[b, -1]) + 1, "cpu")
        angles = positions[b, :, None].double() * inv_freq.double()
        cos, sin = (angles.cos() * mscale)[None], (angles.sin() * mscale)[None]
        q = exact_dynamic.apply_rotary(query[b : b + 1].double(), cos[:, -1:], sin[:, -1:])[:, :, -1:]
        k = exact_dynamic.apply_rotary(key[b : b + 1].double(), cos, sin)
        expected.append(
            torch.nn.functional.scaled_dot_product_attention(
                q, k, value[b : b + 1].double(), attn_mask=mask[b : b + 1].double(), scale=32**-0.5, enable_gqa=True
            ).transpose(1, 2)
        )
    torch.testing.assert_close(out.double(), torch.cat(expected), rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_sdpa_generate_matches_full_forward(method):
    model = patched(method=method, attn_implementation="sdpa")
    ids = tokens(4)
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=3 * L_ORIG - 4, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
        full = model(out.sequences[:, :-1], use_cache=False).logits[:, 3:]
    torch.testing.assert_close(torch.stack(out.logits, dim=1), full, rtol=0, atol=TOL)


@pytest.mark.parametrize("arch", ("llama", "mistral"))
def test_left_padded_batched_generate_equals_each_alone(arch):
    model = patched(arch)
    ids = tokens(8, batch=2)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :3] = 0
    new = 3 * L_ORIG - 8
    kwargs = dict(max_new_tokens=new, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        batched = model.generate(ids, attention_mask=attention_mask, **kwargs)
        for row, start in ((0, 0), (1, 3)):
            alone = model.generate(ids[row : row + 1, start:], **kwargs)
            torch.testing.assert_close(
                torch.stack(batched.logits, 1)[row], torch.stack(alone.logits, 1)[0], rtol=0, atol=TOL
            )
            assert torch.equal(batched.sequences[row, 8:], alone.sequences[0, 8 - start :])


@pytest.mark.parametrize("kernel", ("eager", "sdpa"))
@pytest.mark.parametrize("method", METHODS)
def test_bf16_decoding_is_as_close_to_fp32_as_the_static_method(method, kernel):
    # bf16 decoding rotates the keys with real arithmetic on bf16 tables (no complex bf16); its
    # error against fp32 should be that of static YaRN (transformers' own bf16 rotation).
    ids = tokens(3 * L_ORIG)

    def error(method):
        models = [
            tiny_model(max_positions=L_ORIG, attn_implementation=kernel).to(dtype)
            for dtype in (torch.float32, torch.bfloat16)
        ]
        fp32, bf16 = (cached_step_logits(hf_posext.patch_model(m, method, factor=FACTOR), ids, 4) for m in models)
        return (fp32 - bf16.float()).abs().max().item()

    static = error("yarn")
    assert 0 < error(method) < 3 * static, (error(method), static)


@pytest.mark.parametrize("method", METHODS)
def test_new_shorter_sequence_starts_from_scratch(method):
    model, fresh = patched(method=method), patched(method=method)
    native, native_fresh = patched(method=method, exact_cache=False), patched(method=method, exact_cache=False)
    long_ids, short_ids = tokens(3 * L_ORIG, seed=2), tokens(2 * L_ORIG, seed=3)
    cached_step_logits(model, long_ids, 4)
    cached_step_logits(native, long_ids, 4)
    with torch.no_grad():
        # exact: nothing is remembered between sequences, shorter or not
        torch.testing.assert_close(model(short_ids).logits, fresh(short_ids).logits, rtol=0, atol=0)
        torch.testing.assert_close(
            model(short_ids[:, :L_ORIG]).logits,
            tiny_model(max_positions=L_ORIG)(short_ids[:, :L_ORIG]).logits,
            rtol=0,
            atol=TOL,
        )
        # transformers only resets below L_orig: a 2x sequence after a 3x one keeps the 3x scale
        assert not torch.allclose(native(short_ids).logits, native_fresh(short_ids).logits, atol=1e-3)
        # ... and then starts afresh, YaRN's attention scaling included (transformers resets only the
        # frequencies; hf-posext restores the scaling too)
        below = short_ids[:, : L_ORIG - 1]
        torch.testing.assert_close(native(below).logits, native_fresh(below).logits, rtol=0, atol=0)


@pytest.mark.parametrize("method", METHODS)
def test_concurrent_forwards_each_equal_their_single_threaded_result(method):
    # Two threads (as threaded serving or nn.DataParallel replicas do) run forwards of different
    # lengths through one model. A barrier in the first layer's attention makes both plan their
    # forward (the rotary stand-in runs first) before either attends, so a plan shared by the
    # layers of one model would be the other thread's in one of them.
    model = patched(method=method, attn_implementation="sdpa")
    inputs = {"long": tokens(3 * L_ORIG, seed=4), "short": tokens(L_ORIG + 5, seed=5)}
    with torch.no_grad():
        alone = {name: model(ids).logits for name, ids in inputs.items()}
    barrier = threading.Barrier(2, timeout=60)

    def wait_for_the_other_thread(module, args):
        barrier.wait()

    model.model.layers[0].self_attn.register_forward_pre_hook(wait_for_the_other_thread)
    results, errors = {}, []

    def run(name):
        try:
            with torch.no_grad():
                results[name] = model(inputs[name]).logits
        except Exception as error:  # reported below, with the thread's name
            errors.append((name, error))
            barrier.abort()

    threads = [threading.Thread(target=run, args=(name,)) for name in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for name in inputs:
        assert torch.equal(results[name], alone[name]), name


@pytest.mark.parametrize("method", METHODS)
def test_inference_mode_and_reused_position_ids_give_the_same_logits(method):
    # Plans are found by the position_ids tensor: inference tensors have no version counter, and
    # the same tensor changed in place between forwards must not find the old plan.
    model = patched(method=method)
    ids = tokens(3 * L_ORIG, seed=6)
    with torch.no_grad():
        expected = model(ids).logits
        shifted = model(ids, position_ids=torch.arange(3 * L_ORIG)[None] + 5).logits
        positions = torch.arange(3 * L_ORIG)[None]
        assert torch.equal(model(ids, position_ids=positions).logits, expected)
        positions += 5
        assert torch.equal(model(ids, position_ids=positions).logits, shifted)
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, expected)


def test_unpatch_and_repatch_restore_everything():
    model = tiny_model(max_positions=L_ORIG)
    ids = tokens(3 * L_ORIG)
    with torch.no_grad():
        before = model(ids).logits
        hf_posext.patch_model(model, "dynamic_ntk", factor=FACTOR)
        assert model.config._attn_implementation == "hf_posext_exact_dynamic_eager"
        hf_posext.patch_model(model, "yarn", factor=FACTOR)  # a re-patch undoes the exact machinery
        assert model.config._attn_implementation == "eager"
        static = model(ids).logits
        assert torch.equal(
            static, hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "yarn", factor=FACTOR)(ids).logits
        )
        hf_posext.patch_model(model, "dynamic_yarn", factor=FACTOR)
        hf_posext.unpatch_model(model)
        assert model.config._attn_implementation == "eager"
        assert not any(isinstance(m, exact_dynamic.ExactDynamicRotaryEmbedding) for m in model.modules())
        assert not any(m._forward_pre_hooks for m in model.modules())  # the cache guard is gone too
        assert torch.equal(model(ids).logits, before)


def test_factor_one_and_exact_cache_false_leave_attention_alone():
    for kwargs in (dict(factor=1), dict(factor=FACTOR, exact_cache=False)):
        model = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "dynamic_ntk", **kwargs)
        assert model.config._attn_implementation == "eager"
        assert not any(isinstance(m, exact_dynamic.ExactDynamicRotaryEmbedding) for m in model.modules())


@pytest.mark.parametrize("method", METHODS)
def test_bad_exact_cache_value_is_named(method):
    with pytest.raises(ValueError, match="exact_cache must be True or False, got 'yes'"):
        hf_posext.patch_model(tiny_model(max_positions=L_ORIG), method, factor=FACTOR, exact_cache="yes")


def test_unsupported_kernel_and_kernel_swap_raise():
    model = tiny_model(max_positions=L_ORIG)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match=r"supports attn_implementation in \('eager', 'sdpa'\), got 'flex_attention'"):
        hf_posext.patch_model(model, "dynamic_ntk", factor=FACTOR)
    model = patched()
    model.config._attn_implementation = "sdpa"  # behind the patch's back: the rotation would be lost
    with pytest.raises(ValueError, match="attn_implementation was changed to 'sdpa'"):
        model(tokens(4))


@pytest.mark.parametrize("reloaded", (False, True))
def test_static_cache_is_refused(reloaded, tmp_path):
    # A preallocated cache hands attention all its slots, filled or not: the keys' offsets would be wrong.
    model = patched(attn_implementation="sdpa")
    if reloaded:
        model = reload(model, tmp_path)
    ids = tokens(4)
    with pytest.raises(ValueError, match="needs a cache that grows with the sequence .* got StaticCache"):
        model.generate(ids, max_new_tokens=2, do_sample=False, cache_implementation="static")
    with pytest.raises(ValueError, match="got StaticCache"):
        model(ids, cache=StaticCache(config=model.config, max_cache_len=8), use_cache=True)
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape == (1, 6)  # the default cache is fine
    hf_posext.patch_model(model, "dynamic_yarn", factor=FACTOR, exact_cache=False)  # transformers' behaviour
    model(ids, cache=StaticCache(config=model.config, max_cache_len=8), use_cache=True)


def reload(model, path, **kwargs):
    model.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()


@pytest.mark.parametrize("kernel", ("eager", "sdpa"))
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ARCHS)
def test_reloaded_checkpoint_is_exact(arch, method, kernel, tmp_path):
    # With hf_posext imported, from_pretrained rebuilds the exact machinery from config.hf_posext,
    # on the kernel passed to it; nothing of it is written to config.json.
    model = patched(arch, method, attn_implementation=kernel)
    loaded = reload(model, tmp_path, attn_implementation=kernel)
    assert loaded.config._attn_implementation == exact_dynamic.ATTENTION_PREFIX + kernel
    assert "hf_posext_exact" not in (tmp_path / "config.json").read_text()
    ids = tokens(3 * L_ORIG)
    steps = cached_step_logits(loaded, ids, 4)
    with torch.no_grad():
        full = loaded(ids, use_cache=False).logits
        assert torch.equal(full, model(ids, use_cache=False).logits)
    torch.testing.assert_close(steps, full[:, 3:-1], rtol=0, atol=TOL)
    # Not bit for bit: from_pretrained memory-maps the weights off a 64-byte boundary (Qwen3's by
    # 24 bytes), which changes the BLAS rounding of one-row matmuls; an unpatched reload differs
    # by ~3e-7 there too.
    torch.testing.assert_close(steps, cached_step_logits(model, ids, 4), rtol=0, atol=TOL)


def test_reload_picks_the_kernel_transformers_resolves(tmp_path):
    model = patched(attn_implementation="eager")
    model.save_pretrained(tmp_path)
    default = AutoModelForCausalLM.from_pretrained(tmp_path)  # transformers' default kernel: sdpa
    assert default.config._attn_implementation == "hf_posext_exact_dynamic_sdpa"
    with pytest.raises(ValueError, match=r"supports attn_implementation in \('eager', 'sdpa'\), got 'flex_attention'"):
        AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="flex_attention")


@pytest.mark.parametrize("method", METHODS)
def test_reloaded_exact_cache_false_keeps_transformers_behaviour(method, tmp_path):
    model = patched(method=method, exact_cache=False)
    loaded = reload(model, tmp_path, attn_implementation="eager")
    assert loaded.config._attn_implementation == "eager"
    assert not any(isinstance(m, exact_dynamic.ExactDynamicRotaryEmbedding) for m in loaded.modules())
    # transformers' rotary is stateful: both models see the same calls in the same order
    ids = tokens(3 * L_ORIG)
    steps = cached_step_logits(loaded, ids, 4)
    torch.testing.assert_close(steps, cached_step_logits(model, ids, 4), rtol=0, atol=TOL)
    stale = (steps - cached_step_logits(patched(method=method), ids, 4))[:, 2 * L_ORIG :].abs().max().item()
    assert stale > 100 * TOL, stale
    with torch.no_grad():  # the reloaded rotary resets YaRN's scaling with its frequencies, like the patched one
        below = ids[:, : L_ORIG - 1]
        fresh = patched(method=method, exact_cache=False)
        torch.testing.assert_close(loaded(below).logits, fresh(below).logits, rtol=0, atol=0)


@pytest.mark.parametrize("method", METHODS)
def test_reloaded_checkpoint_unpatches_and_repatches(method, tmp_path):
    ids = tokens(3 * L_ORIG)
    model = patched(method=method)
    loaded = reload(model, tmp_path, attn_implementation="eager")
    with torch.no_grad():
        hf_posext.unpatch_model(loaded)
        assert loaded.config._attn_implementation == "eager"
        assert not any(isinstance(m, exact_dynamic.ExactDynamicRotaryEmbedding) for m in loaded.modules())
        assert torch.equal(loaded(ids).logits, tiny_model(max_positions=L_ORIG)(ids).logits)
        hf_posext.patch_model(loaded, method, factor=FACTOR)
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_model_built_from_a_patched_models_config_is_exact():
    # The config already names the wrapper (hf_posext_exact_dynamic_eager): the new model wraps eager.
    model = patched()
    built = type(model)(copy.deepcopy(model.config)).eval()
    built.load_state_dict(model.state_dict())
    assert built.config._attn_implementation == "hf_posext_exact_dynamic_eager"
    ids = tokens(3 * L_ORIG)
    with torch.no_grad():
        assert torch.equal(built(ids).logits, model(ids).logits)


def test_saved_checkpoint_is_native_for_vanilla_transformers(tmp_path):
    # Vanilla transformers reads the native type and ignores the record, so it loads this config with
    # its own dynamic behaviour, as it loads a checkpoint patched with exact_cache=False.
    patched(method="dynamic_ntk").save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == "dynamic"
    assert saved["hf_posext"]["exact_cache"] is True
    assert "hf_posext_exact" not in json.dumps(saved)


def test_frequency_length_saturates_for_yarn_only():
    yarn = getattr(patched(method="dynamic_yarn").model.layers[0].self_attn, STATE_ATTR)
    ntk = getattr(patched(method="dynamic_ntk").model.layers[0].self_attn, STATE_ATTR)
    lengths = torch.tensor([1, L_ORIG, L_ORIG + 1, FACTOR * L_ORIG, 10 * L_ORIG])
    assert yarn.frequency_length(lengths).tolist() == [L_ORIG, L_ORIG, L_ORIG + 1, FACTOR * L_ORIG, FACTOR * L_ORIG]
    assert ntk.frequency_length(lengths).tolist() == [L_ORIG, L_ORIG, L_ORIG + 1, FACTOR * L_ORIG, 10 * L_ORIG]
    # the saturated length really has the frequencies of every longer one
    far, cap = yarn.frequencies(10 * L_ORIG, torch.device("cpu")), yarn.frequencies(FACTOR * L_ORIG, "cpu")
    assert torch.equal(far[0], cap[0]) and math.isclose(far[1], cap[1])


def test_rotation_is_transformers_rotation_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 32, generator=generator)
    inv_freq, _ = modeling_rope_utils.ROPE_INIT_FUNCTIONS["dynamic"](
        patched(method="dynamic_ntk").config, None, seq_len=3 * L_ORIG
    )
    positions = torch.tensor([[0, 5, 17, 31, 40, 47, 900], [3, 4, 5, 6, 7, 8, 9]])
    cos, sin = exact_dynamic.cos_sin(positions, inv_freq[None], torch.tensor([1.3]), torch.float32)
    angles = positions[..., None].float() * inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    expected, _ = apply_rotary_pos_emb(x, x, emb.cos() * 1.3, emb.sin() * 1.3)
    assert torch.equal(exact_dynamic.apply_rotary(x, cos, sin), expected)


@pytest.mark.parametrize("count", (1, 2, 3, 16, 17, 1000, 4099))
def test_grid_rotations_equal_the_float64_definition(count):
    # scaling * exp(i p theta) on a grid of positions ending at `last`, built from two short
    # tables; its error is that of the fp32 angles themselves (|p theta| * 2^-24), whatever the split.
    inv_freq = 1.0 / (10_000 ** (torch.arange(0, 64, 2) / 64))
    inv_freq = torch.stack((inv_freq, inv_freq / 3)).float()  # two batch rows, two frequency sets
    scaling = torch.tensor([1.0, 1.2])
    for last in (torch.tensor([0]), torch.tensor([count + 5, 7 * count])):
        table = exact_dynamic.grid_rotations(last, count, inv_freq, scaling)
        positions = last[:, None].double() + torch.arange(1 - count, 1, dtype=torch.float64)  # [batch, count]
        angles = positions[..., None] * inv_freq.double()[:, None]
        exact = torch.polar(scaling.double()[:, None, None].expand_as(angles), angles)
        assert table.shape == (2, count, 32) and table.dtype == torch.complex64
        bound = 2 * float(positions.abs().max() + 1) * float(inv_freq.max()) * 2**-24 + 1e-6
        assert (table - exact).abs().max() <= bound
    newest = exact_dynamic.grid_rotations(torch.tensor([0]), count, inv_freq, None)[:, -1]
    assert torch.equal(newest, torch.ones(2, 32, dtype=torch.complex64))  # offset 0 is exactly the identity
    # query rows with their own frequencies: [batch, rows, half] -> [batch, rows, count, half]
    rows = torch.stack((inv_freq, inv_freq * 1.5), dim=1)
    per_row = exact_dynamic.grid_rotations(torch.tensor([count, count + 3]), count, rows, torch.ones(2, 2))
    for b, last in enumerate((count, count + 3)):
        for r in range(2):
            alone = exact_dynamic.grid_rotations(torch.tensor([last]), count, rows[b : b + 1, r], None)[0]
            torch.testing.assert_close(per_row[b, r], alone, rtol=0, atol=0)


@pytest.mark.parametrize("method", METHODS)
def test_chunked_prefill_with_cache_equals_full_forward(method):
    # Several new tokens on top of a cache (chunked prefill, assisted decoding) take the
    # multi-row path with past keys: their positions follow the cache's.
    model = patched("mistral", method)
    ids = tokens(3 * L_ORIG)
    with torch.no_grad():
        full = model(ids).logits
        first = model(ids[:, : L_ORIG + 5], use_cache=True)
        second = model(ids[:, L_ORIG + 5 :], cache=first.cache, use_cache=True)
    torch.testing.assert_close(torch.cat((first.logits, second.logits), dim=1), full, rtol=0, atol=TOL)


def assert_real_rows_close(out, expected, real, kernel):
    """Logits, and with the eager kernel the attention weights, equal at the ``real`` (unpadded) positions."""
    torch.testing.assert_close(out.logits[real], expected.logits[real], rtol=0, atol=TOL)
    if kernel == "eager":
        for weights, reference in zip(out.attentions, expected.attentions, strict=True):
            rows = real[:, None, :, None].expand_as(weights)
            torch.testing.assert_close(weights[rows], reference[rows], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kernel", ("eager", "sdpa"))
@pytest.mark.parametrize("arch", ARCHS)
def test_batched_rowwise_path_equals_kernel_path(arch, kernel, monkeypatch):
    # The rows past L_orig go through one batched matmul per chunk (_attend_rowwise); the
    # kernel path (_attend_rowwise_by_kernel, one single-query kernel item per row) is its
    # reference. A left-padded 3x prompt, in one chunk and in chunks of a few rows.
    model = patched(arch, "dynamic_ntk", attn_implementation=kernel)
    ids = tokens(3 * L_ORIG, batch=2)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :5] = 0
    real = attention_mask.bool()
    calls = []
    batched = exact_rowwise.attend_rowwise
    monkeypatch.setattr(exact_attention, "attend_rowwise", lambda *args: calls.append(1) or batched(*args))
    with torch.no_grad():
        fast = model(ids, attention_mask=attention_mask, output_attentions=kernel == "eager")
        assert calls  # the batched path really ran
        monkeypatch.setattr(exact_rowwise, "ROWWISE_BUDGET", 4 * 2 * 2 * 3 * L_ORIG * 32)  # 4 rows per chunk
        chunked = model(ids, attention_mask=attention_mask, output_attentions=kernel == "eager")
        monkeypatch.setattr(exact_attention, "attend_rowwise", exact_rowwise.attend_rowwise_by_kernel)
        reference = model(ids, attention_mask=attention_mask, output_attentions=kernel == "eager")
    for out in (fast, chunked):
        assert_real_rows_close(out, reference, real, kernel)


@pytest.mark.parametrize("kernel", ("eager", "sdpa"))
@pytest.mark.parametrize("method", ("dynamic_yarn", "longrope"))
def test_a_long_run_of_rows_goes_to_the_kernel_in_blocks_with_the_same_result(method, kernel, monkeypatch):
    # Rows sharing one frequency set (up to L_orig; YaRN's saturated rows; LongRoPE's long factors) are
    # one call; past CALL_MASK_BUDGET mask elements it goes to the kernel in blocks of rows, each seeing
    # the keys up to its last row. A left-padded 5x prompt (YaRN saturates at 4x), whole and in blocks of 3 rows.
    model = tiny_model("llama", max_positions=L_ORIG, attn_implementation=kernel)
    extra = {"factors_by": "query"} if method == "longrope" else {}  # the default longrope has no exact wrapper
    model = hf_posext.patch_model(model, method, factor=FACTOR, exact_cache=True, **extra)
    ids = tokens(5 * L_ORIG, batch=2)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :5] = 0
    real = attention_mask.bool()
    blocks = []
    split = exact_attention.call_blocks
    monkeypatch.setattr(exact_attention, "call_blocks", lambda *args: blocks.extend(split(*args)) or split(*args))
    with torch.no_grad():
        whole = model(ids, attention_mask=attention_mask, output_attentions=kernel == "eager")
        calls = len(blocks)
        monkeypatch.setattr(exact_attention, "CALL_MASK_BUDGET", 3 * 5 * L_ORIG)  # 3 rows per block
        blocked = model(ids, attention_mask=attention_mask, output_attentions=kernel == "eager")
    # the calls really went in blocks of at most 3 rows (the 16 rows up to L_orig see 16 keys: 15 rows a block)
    assert calls and len(blocks) - calls > 2 * calls
    assert max(stop - start for start, stop in blocks[calls:] if stop > L_ORIG) <= 3
    assert_real_rows_close(blocked, whole, real, kernel)


def test_a_32k_longrope_prompts_blocks_keep_the_mask_within_budget():
    # The call of LongRoPE's long-factor rows spans 24k of a 32k prompt past L_orig = 8k: whole, its
    # mask was 24k x 32k elements. Each block's [rows, keys] stays within the budget.
    from hf_posext.attention.exact_dynamic.forward_plan import CALL_MASK_BUDGET, Call

    call = Call(8192, 32768, torch.ones(1, 32), None, torch.ones(1, 24576, dtype=torch.bool))
    blocks = list(exact_attention.call_blocks(call, 32768, torch.device("cpu")))
    assert blocks[0][0] == 8192 and blocks[-1][1] == 32768
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    assert max((stop - start) * stop for start, stop in blocks) <= CALL_MASK_BUDGET
