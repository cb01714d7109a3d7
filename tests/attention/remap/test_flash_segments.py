"""The fused path of remapped attention (flash kernel per piece, log-sum-exp merge) equals the score path.

Both paths score the same pieces; the score path is checked against the authors' float64 code in
tests/methods. The tolerance is tied to a measured baseline: PyTorch's own fused CPU kernel against
an fp32 softmax for plain causal attention of the same shapes.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tests.helpers.models import tiny_model, tokens
from torch import nn

import hf_posext
from hf_posext.attention.inputs import AttentionInputs
from hf_posext.attention.remap import attention as remap
from hf_posext.attention.remap import flash_segments
from hf_posext.methods.dca.remap import DualChunkRemapping
from hf_posext.methods.rerope.remap import ReRopeRemapping
from hf_posext.methods.self_extend.remap import SelfExtendRemapping
from hf_posext.methods.string.remap import StringRemapping

DIM = 32
INV_FREQ = 1.0 / 10000 ** (torch.arange(0, DIM, 2).float() / DIM)
REMAPPINGS = {
    "self_extend G=4 W=16": SelfExtendRemapping(4, 16),
    "self_extend G=3 W=40": SelfExtendRemapping(3, 40),  # the window longer than a block
    "dca": DualChunkRemapping(48, 8),
    "string": StringRemapping(24, 8),
    "rerope": ReRopeRemapping(16, None),
    "leaky_rerope": ReRopeRemapping(16, 4.0),
}
SCALE = DIM**-0.5


def inputs(rows, heads, kv_heads, seq, kv_len, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = 2 * torch.randn(rows, heads, seq, DIM, generator=generator)  # sharp enough that positions matter
    k = 2 * torch.randn(rows, kv_heads, kv_len, DIM, generator=generator)
    v = torch.randn(rows, kv_heads, kv_len, DIM, generator=generator)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def baseline_gap(q, k, v):
    """The fused kernel's own rounding: SDPA's CPU flash kernel against an fp32 softmax, causal, same shapes."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(groups, 1), v.float().repeat_interleave(groups, 1)
    q = q.float()
    fused, _ = flash_segments.flash_with_lse(q, k, v, SCALE, causal=True)
    scores = (q @ k.transpose(-1, -2) * SCALE).masked_fill(
        torch.ones(q.shape[2], k.shape[2]).triu(1).bool(), -torch.inf
    )
    return float((fused - scores.softmax(-1) @ v).abs().max())


def both_paths(remapping, q, k, v, past, offset, positions=None):
    assert k.shape[2] - q.shape[2] == past  # the kernels take the cached keys from the shapes

    def layout():
        if positions is not None:
            return remapping.positioned_layout(q, k, positions, INV_FREQ)
        return remapping.layout(q, k, past, offset, INV_FREQ)

    inputs = AttentionInputs(nn.Module().eval(), q, k, v, None, {"scaling": SCALE})
    fused = flash_segments.flash_segmented_attention(inputs, layout(), offset, SCALE)
    score = remap.segmented_attention(inputs, layout(), offset)
    return fused, score


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """32-row blocks: the lengths below cross blocks, windows and chunks on both paths."""
    monkeypatch.setattr(flash_segments, "FLASH_BLOCK", 32)
    monkeypatch.setattr(remap, "BLOCK_ELEMENTS", 6 * 32 * 200)


@pytest.mark.parametrize("name", sorted(REMAPPINGS))
@pytest.mark.parametrize(
    ("rows", "heads", "kv_heads"), [(1, 6, 2), (2, 4, 4), (1, 3, 1)], ids=["gqa", "mha-2rows", "mqa"]
)
@pytest.mark.parametrize(
    ("past", "seq", "offset"),
    [(0, 200, 0), (120, 80, 0), (199, 1, 0), (0, 150, 37)],
    ids=["prefill", "cached-chunk", "decode", "offset"],
)
def test_the_fused_path_equals_the_score_path(name, rows, heads, kv_heads, past, seq, offset):
    q, k, v = inputs(rows, heads, kv_heads, seq, past + seq)
    fused, score = both_paths(REMAPPINGS[name], q, k, v, past, offset)
    gap = baseline_gap(*inputs(rows, heads, kv_heads, past + seq, past + seq))
    assert fused.shape == score.shape == (rows, seq, heads, DIM)
    assert (fused - score).abs().max() <= 4 * gap


@pytest.mark.parametrize("name", sorted(REMAPPINGS))
def test_positions_that_jump_pair_by_pair_agree_too(name):
    """:class:`~hf_posext.attention.remap.layout.PairLayout`: every piece chosen per pair and masked causally."""
    q, k, v = inputs(1, 6, 2, 120, 120)
    positions = torch.cat((torch.arange(40), torch.arange(150, 230)))
    fused, score = both_paths(REMAPPINGS[name], q, k, v, 0, 0, positions)
    assert (fused - score).abs().max() <= 4 * baseline_gap(q, k, v)


@pytest.mark.parametrize("name", ["self_extend G=4 W=16", "dca"])
def test_bf16_inputs_agree_up_to_the_output_rounding(name):
    """Both paths score bf16 inputs in fp32; the fused one rounds its output to bf16 once (<= half a bf16 step)."""
    q, k, v = inputs(1, 6, 2, 200, 200, dtype=torch.bfloat16)
    fused, score = both_paths(REMAPPINGS[name], q, k, v, 0, 0)
    assert fused.dtype == torch.bfloat16 and score.dtype == torch.float32
    assert ((fused.float() - score).abs() <= 2**-8 * score.abs() + 4 * baseline_gap(q, k, v)).all()


@pytest.mark.parametrize(
    ("method", "kwargs"),
    [
        ("self_extend", {"group_size": 4, "window_size": 16}),
        ("dca", {"chunk_size": 48, "local_size": 8}),
        ("string", {"shift": 24, "local_window": 8}),
        ("rerope", {"window": 16}),
    ],
)
def test_a_bf16_model_is_as_close_to_fp32_as_the_unpatched_model_is(method, kwargs):
    """bf16 weights, fused path: off the fp32 model by at most 2x the unpatched model's own bf16 error (1.3x seen)."""
    base = tiny_model("llama", attn_implementation="sdpa")
    ids = tokens(192)

    def logits(model):
        with torch.no_grad():
            return model(ids).logits.float()

    native = (logits(copy.deepcopy(base).to(torch.bfloat16)) - logits(base)).abs().max()
    fp32 = hf_posext.patch_model(copy.deepcopy(base), method, **kwargs)
    bf16 = hf_posext.patch_model(copy.deepcopy(base), method, **kwargs).to(torch.bfloat16)
    assert (logits(bf16) - logits(fp32)).abs().max() <= 2 * native


def _spy(monkeypatch):
    calls = {"fused": 0, "score": 0}
    fused, score = remap.flash_segmented_attention, remap.segmented_attention
    monkeypatch.setattr(
        remap, "flash_segmented_attention", lambda *a: calls.__setitem__("fused", calls["fused"] + 1) or fused(*a)
    )
    monkeypatch.setattr(
        remap, "segmented_attention", lambda *a: calls.__setitem__("score", calls["score"] + 1) or score(*a)
    )
    return calls


def _generate(model, ids, mask=None):
    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids) if mask is None else mask,
        max_new_tokens=6,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )


@pytest.mark.newest
@pytest.mark.parametrize("method", ["self_extend", "dca"])
def test_cached_generation_takes_the_fused_path_and_matches_the_score_path(method, monkeypatch):
    kwargs = {"self_extend": {"group_size": 4, "window_size": 16}, "dca": {"chunk_size": 48, "local_size": 8}}[method]
    model = hf_posext.patch_model(tiny_model("llama", attn_implementation="sdpa"), method, **kwargs)
    ids = tokens(150)
    calls = _spy(monkeypatch)
    fused = _generate(model, ids)
    assert calls == {"fused": 2 * 6, "score": 0}  # prefill and five decode steps, two layers
    monkeypatch.setattr(remap, "flash_available", lambda *a: False)
    score = _generate(model, ids)
    assert torch.equal(fused.sequences, score.sequences)
    for step, (a, b) in enumerate(zip(fused.logits, score.logits)):
        assert (a - b).abs().max() <= 1e-4, step


def test_a_padding_mask_takes_the_score_path(monkeypatch):
    model = hf_posext.patch_model(
        tiny_model("llama", attn_implementation="sdpa"), "self_extend", group_size=4, window_size=16
    )
    ids = tokens(120, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :20] = 0
    calls = _spy(monkeypatch)
    with torch.no_grad():
        model(ids, attention_mask=mask)
    assert calls["fused"] == 0 and calls["score"] > 0


def test_training_softcap_and_a_torch_without_the_kernel_take_the_score_path(monkeypatch):
    module = nn.Module()
    q = torch.randn(1, 4, 8, DIM)
    assert flash_segments.flash_available(module.eval(), {}, q)
    assert not flash_segments.flash_available(module.eval(), {"softcap": 30.0}, q)
    assert not flash_segments.flash_available(module.train(), {"dropout": 0.1}, q)
    with torch.enable_grad():
        assert not flash_segments.flash_available(module.eval(), {}, q.requires_grad_())
    monkeypatch.setattr(flash_segments, "_KERNEL", "_no_such_kernel")
    assert not flash_segments.flash_available(module.eval(), {}, q.detach())
