"""The folded ALiBi path (ALiBi as extra query/key channels of SDPA's causal kernel).

Run: ``.venv/bin/pytest tests/methods/alibi/test_folded.py -q``. Its error is measured against an
fp64 reference and held to the exact fp32 path's own error plus the bound the module derives, at
lengths where folding without the slope split, or with the channels summed last, is 10-50x worse.
"""

from __future__ import annotations

import pytest
import torch
from tests.helpers.models import ARCHITECTURES, tiny_model, tokens
from transformers import masking_utils

import hf_posext
from hf_posext.methods.alibi import alibi_slopes
from hf_posext.methods.alibi import attention as alibi_module
from hf_posext.methods.alibi import folded as alibi_folded
from hf_posext.methods.alibi.attention import alibi_attention_forward, alibi_mask, distance_mask, eager_alibi
from hf_posext.methods.alibi.folded import folded_alibi, logit_error_bound, split_slopes


def fp64_reference(q, k, v, q_pos, kv_pos, window=None, key_is_real=None):
    """softmax(q.k / sqrt(d) - m_h (i - j)) over causal (windowed) real keys, in fp64.

    Returns ``[batch, q, heads, dim]`` and ``[batch, q]``: the queries with at least one key.
    """
    heads, groups = q.shape[1], q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(groups, 1) for t in (k, v))
    distance = (q_pos[:, None] - kv_pos[None, :]).double()
    allowed = (distance >= 0)[None, None]
    if window is not None:
        allowed = allowed & (distance < window)
    if key_is_real is not None:
        allowed = allowed & key_is_real[:, None, None, :]
    slopes = alibi_slopes(heads).double().view(1, heads, 1, 1)
    logits = q.double() @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 - slopes * distance
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
    return (weights @ v).transpose(1, 2), allowed[:, 0].any(-1).expand(q.shape[0], -1)


class Attention(torch.nn.Module):
    def __init__(self, backend):
        super().__init__()
        self.config = type("Config", (), {"hf_posext": {"backend": backend}})()


def qkv(batch, heads, kv_heads, q_len, kv_len, dim=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=generator) * 2
    k = torch.randn(batch, kv_heads, kv_len, dim, generator=generator) * 2
    v = torch.randn(batch, kv_heads, kv_len, dim, generator=generator)
    return q, k, v


def causal_or_window(window):
    if window is None:
        return masking_utils.causal_mask_function
    return masking_utils.sliding_window_causal_mask_function(window)


# name: (q_len, kv_len, q_offset, kv_offset, padding over kv_offset + kv_len or None, window or None)
FOLDED_CASES = {
    "prefill": (12, 12, 0, 0, None, None),
    "left_padding": (12, 12, 0, 0, torch.arange(12)[None] >= torch.tensor([[0], [5]]), None),
    "right_padding": (12, 12, 0, 0, torch.arange(12)[None] < torch.tensor([[12], [7]]), None),
    "decode": (1, 14, 13, 0, None, None),
    # a static cache's buffer, empty before the prefill: its unused slots come as padding
    "static_prefill": (5, 16, 0, 0, torch.arange(16)[None].repeat(2, 1) < 5, None),
    "window_longer_than_keys": (12, 12, 0, 0, None, 16),
}


@pytest.mark.parametrize("case", sorted(FOLDED_CASES))
@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4)])
def test_masks_is_causal_can_express_run_folded_and_match_the_reference(case, heads, kv_heads):
    q_len, kv_len, q_offset, kv_offset, pad, window = FOLDED_CASES[case]
    mask_function = causal_or_window(window)
    module = Attention("folded").eval()
    mask = alibi_mask(
        batch_size=2,
        q_length=q_len,
        kv_length=kv_len,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=pad,
        config=module.config,
        allow_is_causal_skip=True,
        local_size=window,
    )
    # is_causal, as transformers' SDPA would run it, plus the keys that are real
    if pad is None:
        assert mask is None
    else:
        assert mask.dtype == torch.bool and mask.shape == (2, 1, 1, kv_len)
    q, k, v = qkv(2, heads, kv_heads, q_len, kv_len, dim=8)
    with torch.no_grad():
        out, _ = alibi_attention_forward(module, q, k, v, mask, scaling=8**-0.5)
    key_is_real = None if pad is None else pad[:, kv_offset : kv_offset + kv_len]
    expected, has_key = fp64_reference(
        q, k, v, torch.arange(q_len) + q_offset, torch.arange(kv_len) + kv_offset, window, key_is_real
    )
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[has_key].double(), expected[has_key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "q_len,kv_len,q_offset,pad,window,allow",
    [
        (1, 12, 11, torch.arange(12)[None] >= 3, None, True),  # one query with padding: [batch, 1, 1, kv] already
        (12, 12, 0, None, 5, True),  # a window shorter than the keys
        (12, 12, 0, None, None, False),  # transformers switched the skip off (packed sequences, compiled decode)
        # one token into an empty static cache: SDPA would skip the mask, but the query is key 0, not the last key
        (1, 16, 0, torch.arange(16)[None] < 1, None, True),
        (4, 12, 8, None, None, True),  # a cache prefilled in blocks: causal from the bottom right
    ],
)
def test_masks_is_causal_cannot_express_take_the_exact_sdpa_path(q_len, kv_len, q_offset, pad, window, allow):
    config = Attention("folded").config
    mask = alibi_mask(
        batch_size=1,
        q_length=q_len,
        kv_length=kv_len,
        q_offset=q_offset,
        mask_function=causal_or_window(window),
        attention_mask=pad,
        config=config,
        allow_is_causal_skip=allow,
        local_size=window,
    )
    assert mask.dtype == torch.float32 and mask.shape == (1, 1, q_len, kv_len)


def test_split_slopes_are_exact_and_short():
    for heads in (4, 12, 32, 40):
        for kv_length in (16, 1024, 8192, 131072):
            bits = alibi_folded.position_bits(kv_length)
            high, low = split_slopes(heads, bits, torch.device("cpu"))
            assert torch.equal(high + low, alibi_slopes(heads))
            positions = torch.arange(kv_length - 1, kv_length, dtype=torch.float64)
            # m_hi * the largest position is exact in fp32
            assert torch.equal((high.double() * positions).float().double(), high.double() * positions)
    with pytest.raises(ValueError, match="up to 8388608 keys, got 16777217"):
        alibi_folded.position_bits(2**24 + 1)


def attention_errors(heads, length):
    """Max |output - fp64| of the exact eager fp32 path and of the folded path, and max |v|."""
    q, k, v = qkv(1, heads, 2, length, length)
    module = Attention("folded").eval()
    positions = torch.arange(length)
    expected, _ = fp64_reference(q, k, v, positions, positions)
    allowed = positions[None, :] <= positions[:, None]
    with torch.no_grad():
        exact, _ = eager_alibi(module, q, k, v, distance_mask(allowed[None, None]), 64**-0.5)
        folded, _ = folded_alibi(module, q, k, v, 64**-0.5)
    return (exact.double() - expected).abs().max(), (folded.double() - expected).abs().max(), v.abs().max()


@pytest.mark.parametrize("heads,length", [(4, 2048), (12, 1024)])
def test_folded_error_stays_within_the_exact_paths_error_plus_the_derived_bound(heads, length):
    # One channel pair, or unsplit slopes (12 heads: slopes 2^-0.5...), errs 1e-5..5e-5 here; the
    # exact path errs ~1e-6. An output moves by at most 2 max|v| times the largest logit error.
    exact_error, folded_error, v_max = attention_errors(heads, length)
    bound = 2 * exact_error + 2 * v_max * logit_error_bound(heads, length)
    assert folded_error <= bound, (float(folded_error), float(exact_error), float(bound))


def test_folded_gradients_match_eager():
    q, k, v = qkv(2, 6, 2, 96, 96, dim=16)
    module = Attention("folded").train()
    grads = {}
    for name in ("eager", "folded"):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        if name == "eager":
            allowed = torch.ones(96, 96, dtype=torch.bool).tril()
            out, _ = eager_alibi(module, *inputs, distance_mask(allowed[None, None]), 16**-0.5)
        else:
            out, _ = folded_alibi(module, *inputs, 16**-0.5)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads[name] = [t.grad for t in inputs]
    for got, expected, name in zip(grads["folded"], grads["eager"], "qkv"):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("padded", [False, True])
def test_patched_model_trains_through_folded_with_eager_gradients(padded, monkeypatch):
    calls = []
    monkeypatch.setattr(alibi_module, "folded_alibi", lambda *a, **kw: calls.append(1) or folded_alibi(*a, **kw))
    ids = tokens(40, batch=2)
    mask = torch.arange(40)[None] >= torch.tensor([[0], [13]]) if padded else None
    labels = ids
    if padded:
        # no loss on padding, nor on the token a padding position would predict (a padding row has
        # no key to attend to, so its output is arbitrary and differs between the paths)
        labels = ids.masked_fill(~mask, -100)
        labels[:, 1:][~mask[:, :-1]] = -100
    grads = {}
    for backend in ("eager", "folded"):
        model = hf_posext.patch_model(tiny_model(heads=6, kv_heads=2), "alibi", backend=backend).train()
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        grads[backend] = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert len(calls) == 2  # both layers ran the folded path
    for name, grad in grads["eager"].items():
        torch.testing.assert_close(grads["folded"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_patched_models_run_folded_and_agree_with_eager(arch, monkeypatch):
    calls = []
    monkeypatch.setattr(alibi_module, "folded_alibi", lambda *a, **kw: calls.append(1) or folded_alibi(*a, **kw))
    ids = tokens(24, batch=2)
    # max_positions=16 gives Mistral a 32-token window, longer than the keys: is_causal holds
    model = hf_posext.patch_model(tiny_model(arch, heads=6, kv_heads=2, max_positions=16), "alibi", backend="eager")
    with torch.no_grad():
        expected = model(ids).logits
        hf_posext.patch_model(model, "alibi", backend="folded")
        got = model(ids).logits
    assert len(calls) == 2
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
