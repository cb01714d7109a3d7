"""ALiBi: slopes, every attention path against a slow reference, and the model-level properties.

Run: ``.venv/bin/pytest tests/methods/alibi/test_attention.py -q`` (the compiled FlexAttention test is marked slow,
the flash-attn one gpu). The flex path runs uncompiled here (``FLEX_COMPILE = False``): PyTorch
then evaluates the very same score_mod / mask_mod on materialised scores; compiling costs about a
minute on two CPU cores and is covered by the slow test and by benchmarks/bench_alibi.py.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from tests.helpers.models import ARCHITECTURES, tiny_model, tokens, train_steps
from scripts.vanilla import vanilla_load_error
from transformers import AutoModelForCausalLM, masking_utils

import hf_posext
from hf_posext.methods.alibi import alibi_slopes, select_backend
from hf_posext.methods.alibi import attention as alibi_module
from hf_posext.methods.alibi.attention import ALIBI_ATTENTION, OLD_ALIBI_ATTENTION, alibi_attention_forward, alibi_mask
from hf_posext.rope_utils import NO_ROPE_TYPE

CPU_PATHS = ["eager", "sdpa", "flex", "folded"]


@pytest.fixture(autouse=True)
def uncompiled_flex(monkeypatch):
    monkeypatch.setattr(alibi_module, "FLEX_COMPILE", False)


# --- slopes -------------------------------------------------------------------------------------


def press_get_slopes(n: int) -> list[float]:
    """Press et al.'s get_slopes as the paper's repository describes it: a geometric sequence
    starting at 2^(-8/n) with that same ratio when n is a power of two; otherwise the sequence of
    the closest lower power of two followed by every other element of the sequence for twice it."""

    def power_of_two(count: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(count) - 3)))
        return [start * start**i for i in range(count)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + press_get_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", range(1, 65))
def test_slopes_equal_press_get_slopes(heads):
    expected = torch.tensor(press_get_slopes(heads), dtype=torch.float64)
    got = alibi_slopes(heads)
    assert got.dtype == torch.float32 and got.shape == (heads,)
    torch.testing.assert_close(got.double(), expected, rtol=2**-23, atol=0)


def test_slopes_examples_from_the_reference_code():
    # the reference code's get_slopes: 4 heads are 2^-2..2^-8; 12 heads continue with the odd half-steps.
    assert alibi_slopes(4).tolist() == [2**-2, 2**-4, 2**-6, 2**-8]
    twelve = [2.0**-k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    torch.testing.assert_close(
        alibi_slopes(12).double(), torch.tensor(twelve, dtype=torch.float64), rtol=2**-23, atol=0
    )


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, None])
def test_slopes_reject_bad_head_counts(bad):
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(bad)


# --- the attention function against a slow reference --------------------------------------------


def reference_attention(q, k, v, allowed, q_pos, kv_pos):
    """softmax(q.k / sqrt(d) - m_h (i - j)) over allowed keys, one head and one query at a time, fp64.

    Returns ``[batch, q, heads, head_dim]`` and the rows that have at least one allowed key.
    """
    batch, heads, q_len, dim = q.shape
    groups = heads // k.shape[1]
    slopes = press_get_slopes(heads)
    out = torch.zeros(batch, q_len, heads, dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(q_len):
                keys = [j for j in range(k.shape[2]) if allowed[b, i, j]]
                if not keys:
                    continue
                logits = torch.tensor(
                    [
                        float(q[b, h, i].double() @ k[b, h // groups, j].double()) / math.sqrt(dim)
                        - slopes[h] * float(q_pos[i] - kv_pos[j])
                        for j in keys
                    ],
                    dtype=torch.float64,
                )
                weights = torch.softmax(logits, dim=0)
                out[b, i, h] = sum(w * v[b, h // groups, j].double() for w, j in zip(weights, keys))
    has_key = allowed.any(-1)  # [batch, q]
    return out, has_key


def padding(batch_lengths, total, left=True):
    mask = torch.zeros(len(batch_lengths), total, dtype=torch.bool)
    for row, length in enumerate(batch_lengths):
        if left:
            mask[row, total - length :] = True
        else:
            mask[row, :length] = True
    return mask


CASES = {
    # name: (q_len, kv_len, q_offset, kv_offset, padding mask over kv_offset + kv_len or None, window or None)
    "causal": (12, 12, 0, 0, None, None),
    "left_padding": (12, 12, 0, 0, padding([12, 7], 12), None),
    "right_padding": (12, 12, 0, 0, padding([12, 5], 12, left=False), None),
    "cached_decode": (3, 14, 11, 0, padding([14, 9], 14), None),
    "sliding_window": (12, 12, 0, 0, padding([12, 10], 12), 5),
    # a sliding-window cache keeps the last keys only: the first kept key is absolute position 6
    "sliding_cache": (2, 8, 12, 6, None, 5),
    # a static cache's buffer is longer than what has been written (9 tokens; queries at 6..8)
    "static_cache": (3, 16, 6, 0, padding([9, 6], 9), None),
}


def allowed_matrix(batch, q_len, kv_len, q_offset, kv_offset, pad, window):
    """Which keys each query may see, from the definitions: causal, within the window, not padding."""
    allowed = torch.zeros(batch, q_len, kv_len, dtype=torch.bool)
    for b in range(batch):
        for i in range(q_len):
            for j in range(kv_len):
                qi, kj = i + q_offset, j + kv_offset
                ok = kj <= qi and (window is None or qi - kj < window)
                if pad is not None:
                    ok = ok and kj < pad.shape[1] and bool(pad[b, kj])
                allowed[b, i, j] = ok
    return allowed


class FakeAttention(nn.Module):
    """The attributes transformers' attention layers expose to an attention function."""

    def __init__(self, backend, heads, kv_heads):
        super().__init__()
        self.config = SimpleNamespace(hf_posext={"backend": backend})
        self.num_key_value_groups = heads // kv_heads


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backend", CPU_PATHS)
@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4)])
def test_attention_paths_match_slow_reference(case, backend, heads, kv_heads):
    q_len, kv_len, q_offset, kv_offset, pad, window = CASES[case]
    if window is None:
        mask_fn = masking_utils.causal_mask_function
    else:
        mask_fn = masking_utils.sliding_window_causal_mask_function(window)
    batch, dim = 2, 8
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, q_len, dim, generator=generator) * 2
    k = torch.randn(batch, kv_heads, kv_len, dim, generator=generator) * 2
    v = torch.randn(batch, kv_heads, kv_len, dim, generator=generator)
    module = FakeAttention(backend, heads, kv_heads).eval()
    mask = alibi_mask(
        batch_size=batch,
        q_length=q_len,
        kv_length=kv_len,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_fn,
        attention_mask=pad,
        device="cpu",
        config=module.config,
    )
    with torch.no_grad():
        out, _ = alibi_attention_forward(module, q, k, v, mask, scaling=dim**-0.5)
    allowed = allowed_matrix(batch, q_len, kv_len, q_offset, kv_offset, pad, window)
    expected, has_key = reference_attention(
        q, k, v, allowed, torch.arange(q_len) + q_offset, torch.arange(kv_len) + kv_offset
    )
    assert out.shape == (batch, q_len, heads, dim)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[has_key].double(), expected[has_key], rtol=1e-5, atol=1e-5)


def test_mask_holds_negative_distances_and_inf():
    mask = alibi_mask(
        batch_size=1,
        q_length=3,
        kv_length=5,
        q_offset=2,
        kv_offset=0,
        attention_mask=padding([4], 5, left=False),
        config=SimpleNamespace(hf_posext={"backend": "sdpa"}),
    )
    inf = float("-inf")
    expected = torch.tensor([[-2.0, -1.0, 0.0, inf, inf], [-3.0, -2.0, -1.0, 0.0, inf], [-4.0, -3.0, -2.0, -1.0, inf]])
    assert torch.equal(mask[0, 0], expected)


def test_backend_selection():
    assert select_backend("auto", "cpu", torch.float32) == "sdpa"
    assert select_backend("eager", "cpu", torch.bfloat16) == "eager"
    with pytest.raises(ValueError, match="'fast'.*allowed: auto, eager, sdpa, flex, flash"):
        select_backend("fast", "cpu", torch.float32)
    with pytest.raises(ImportError, match="flash_attn"):
        select_backend("flash", "cpu", torch.float16)


# --- the patched model --------------------------------------------------------------------------


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits


def alibi_model(arch="llama", backend="sdpa", **kwargs):
    return hf_posext.patch_model(tiny_model(arch, **kwargs), "alibi", backend=backend)


def test_rotary_becomes_the_identity():
    model = alibi_model()
    rotary = model.model.rotary_emb
    x = torch.randn(1, 5, 8)
    cos, sin = rotary(x, torch.arange(5)[None] * 1000)
    assert torch.equal(cos, torch.ones_like(cos)) and torch.equal(sin, torch.zeros_like(sin))
    assert model.config._attn_implementation == ALIBI_ATTENTION
    assert hf_posext.patch_info(model)["method"] == "alibi"


# flex runs uncompiled here, a few seconds per model: two architectures (one with a sliding window)
@pytest.mark.newest
@pytest.mark.parametrize(
    "arch,backend",
    [(arch, "sdpa") for arch in sorted(ARCHITECTURES)]
    + [("llama", "flex"), ("mistral", "flex"), ("llama", "folded"), ("mistral", "folded")],
)
def test_model_paths_agree_with_eager(arch, backend):
    # max_positions=8 gives Mistral a 16-token window, shorter than the 24 tokens here
    model = alibi_model(arch, backend="eager", heads=6, kv_heads=2, max_positions=8)
    ids = tokens(24, batch=2)
    mask = padding([24, 17], 24)
    expected = logits(model, ids, attention_mask=mask)
    hf_posext.patch_model(model, "alibi", backend=backend)
    torch.testing.assert_close(
        logits(model, ids, attention_mask=mask)[1, -17:], expected[1, -17:], rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(logits(model, ids, attention_mask=mask)[0], expected[0], rtol=1e-5, atol=1e-5)


def test_alibi_changes_the_model_and_unpatch_restores_it():
    model = tiny_model()
    ids = tokens(20)
    before = logits(model, ids)
    config_before = model.config.to_dict()
    hf_posext.patch_model(model, "alibi")
    assert not torch.allclose(logits(model, ids), before)
    hf_posext.unpatch_model(model)
    assert torch.equal(logits(model, ids), before)
    assert model.config.to_dict() == config_before
    assert model.config._attn_implementation == "eager"


def test_repatching_to_a_rope_method_drops_alibi():
    model = alibi_model()
    hf_posext.patch_model(model, "yarn", factor=2)
    assert model.config._attn_implementation == "eager"
    expected = hf_posext.patch_model(tiny_model(), "yarn", factor=2)
    assert torch.equal(logits(model, tokens(20)), logits(expected, tokens(20)))


def test_sdpa_and_eager_agree_on_gradients():
    grads = {}
    ids = tokens(24, batch=2)
    mask = padding([24, 15], 24)
    # no loss on padding, nor on the token a padding position would predict (padding rows have
    # no key to attend to, so their output is arbitrary and differs between the paths)
    labels = ids.masked_fill(~mask, -100)
    labels[:, 1:][~mask[:, :-1]] = -100
    for backend in ("eager", "sdpa"):
        model = alibi_model(backend=backend, heads=6, kv_heads=2).train()
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        grads[backend] = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert grads["eager"].keys() == grads["sdpa"].keys()
    for name, grad in grads["eager"].items():
        torch.testing.assert_close(grads["sdpa"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_left_padded_rows_equal_rows_alone(arch):
    model = alibi_model(arch)
    ids = tokens(16, batch=3)
    lengths = [16, 11, 6]
    mask = padding(lengths, 16)
    batched = logits(model, ids, attention_mask=mask)
    for row, length in enumerate(lengths):
        alone = logits(model, ids[row : row + 1, 16 - length :])
        torch.testing.assert_close(batched[row, 16 - length :], alone[0], rtol=1e-5, atol=1e-5)


def greedy_without_cache(model, ids, steps):
    for _ in range(steps):
        with torch.no_grad():
            next_token = model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_token], dim=-1)
    return ids


@pytest.mark.newest
@pytest.mark.parametrize(
    "arch,backend,cache",
    [
        ("llama", "sdpa", None),
        ("llama", "eager", None),
        ("qwen3", "sdpa", None),
        ("mistral", "sdpa", None),
        ("llama", "sdpa", "static"),
        ("llama", "folded", None),
        ("mistral", "folded", None),
        ("llama", "folded", "static"),
    ],
)
def test_cached_generation_equals_full_forward_greedy(arch, backend, cache):
    # Mistral's window (2 * max_positions = 16 tokens) is shorter than prompt + generation, so
    # the sliding-window cache drops keys while decoding. A static cache's key buffer is longer
    # than what has been written, so distances must come from its offsets, not from shapes.
    model = alibi_model(arch, backend=backend, max_positions=8)
    model.generation_config.eos_token_id = None
    prompt = tokens(14, batch=1)
    cached = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0, cache_implementation=cache)
    assert torch.equal(cached, greedy_without_cache(model, prompt, 10))


@pytest.mark.parametrize("backend", ["sdpa", "folded"])
def test_left_padded_batch_generation_equals_rows_alone(backend):
    model = alibi_model(backend=backend)
    model.generation_config.eos_token_id = None
    ids = tokens(12, batch=2)
    mask = padding([12, 7], 12)
    batched = model.generate(
        ids.masked_fill(~mask, 0), attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0
    )
    alone = model.generate(ids[1:, 5:], max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(batched[1, 12:], alone[0, 7:])


def test_mistral_sliding_window_limits_what_a_token_sees():
    # Two layers with a 16-token window: position 39 sees at most 2 * 15 tokens back.
    model = alibi_model("mistral", max_positions=8)
    assert model.config.sliding_window == 16
    ids = tokens(40)
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 1) % 97
    before, after = logits(model, ids), logits(model, changed)
    torch.testing.assert_close(after[0, 39], before[0, 39], rtol=0, atol=0)
    assert not torch.allclose(after[0, 10], before[0, 10])


@pytest.mark.parametrize("backend", ["eager", "sdpa", "folded"])
def test_bf16_error_is_comparable_to_the_native_models(backend):
    ids = tokens(48, batch=2)
    native = tiny_model(attn_implementation="sdpa")
    native_fp32 = logits(native, ids)
    native_error = (logits(native.to(torch.bfloat16), ids).float() - native_fp32).abs().max()
    model = alibi_model(backend=backend)
    fp32 = logits(model, ids)
    error = (logits(model.to(torch.bfloat16), ids).float() - fp32).abs().max()
    assert torch.isfinite(error)
    assert error <= 3 * native_error, (float(error), float(native_error))


def test_a_tiny_alibi_model_learns():
    torch.manual_seed(0)
    model = alibi_model(heads=4, kv_heads=2).train()
    # a periodic sequence: predictable only from what came a fixed distance before
    ids = (torch.arange(28) % 7 + 3)[None].repeat(2, 1)
    losses = train_steps(model, ids)
    assert losses[-1] < 0.5 * losses[0], losses


def test_flex_refuses_cpu_training_with_a_clear_error():
    model = alibi_model(backend="flex").train()
    ids = tokens(8)
    with pytest.raises(ValueError, match="cannot train on CPU.*backend='sdpa'"):
        model(ids, labels=ids)


@pytest.mark.parametrize(
    "kwargs,match",
    [({"backend": "fast"}, "backend must be one of"), ({"factor": 4}, "factor must be 1")],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hf_posext.patch_model(tiny_model(), "alibi", **kwargs)


# --- checkpoints --------------------------------------------------------------------------------


def test_saved_checkpoint_reloads_as_alibi(tmp_path):
    model = alibi_model(heads=6, kv_heads=2)
    ids = tokens(20, batch=2)
    expected = logits(model, ids)
    model.save_pretrained(tmp_path / "a")
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["attn_implementation"] == ALIBI_ATTENTION
    assert saved["rope_parameters"]["rope_type"] == NO_ROPE_TYPE

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    assert reloaded.config._attn_implementation == ALIBI_ATTENTION
    assert torch.equal(logits(reloaded, ids), expected)

    # saved again after a reload, it still reloads as ALiBi
    reloaded.save_pretrained(tmp_path / "b")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["attn_implementation"] == ALIBI_ATTENTION

    # asking for a native implementation at load picks that ALiBi path instead of dropping ALiBi
    as_eager = AutoModelForCausalLM.from_pretrained(tmp_path / "a", attn_implementation="eager")
    assert as_eager.config._attn_implementation == ALIBI_ATTENTION
    assert as_eager.config.hf_posext["backend"] == "eager"
    torch.testing.assert_close(logits(as_eager, ids), expected, rtol=1e-5, atol=1e-5)


def test_vanilla_transformers_refuses_the_checkpoint_naming_the_import(tmp_path):
    alibi_model().save_pretrained(tmp_path)
    assert 'attn_implementation="hf_posext_alibi (requires: import hf_posext)"` is not supported' in vanilla_load_error(
        tmp_path
    )


def test_a_checkpoint_saved_under_the_old_attention_name_loads_as_alibi(tmp_path):
    model = alibi_model(heads=6, kv_heads=2)
    ids = tokens(20, batch=2)
    expected = logits(model, ids)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "attn_implementation": OLD_ALIBI_ATTENTION}))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.config._attn_implementation == ALIBI_ATTENTION
    assert torch.equal(logits(reloaded, ids), expected)
    reloaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["attn_implementation"] == ALIBI_ATTENTION


# --- compiled / GPU paths -----------------------------------------------------------------------


@pytest.mark.slow
def test_compiled_flex_matches_eager(monkeypatch):
    monkeypatch.setattr(alibi_module, "FLEX_COMPILE", True)
    model = alibi_model(backend="eager", heads=4, kv_heads=2)
    ids = tokens(64, batch=2)
    mask = padding([64, 40], 64)
    expected = logits(model, ids, attention_mask=mask)
    hf_posext.patch_model(model, "alibi", backend="flex")
    got = logits(model, ids, attention_mask=mask)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1, -40:], expected[1, -40:], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flash", "flex", "sdpa", "folded"])
def test_gpu_paths_match_eager_in_bf16(backend):
    if backend == "flash":
        pytest.importorskip("flash_attn")
    ids = tokens(64, batch=2).cuda()
    mask = padding([64, 40], 64).cuda()
    model = alibi_model("mistral", backend="eager", max_positions=8).cuda().to(torch.bfloat16)
    expected = logits(model, ids, attention_mask=mask).float()
    hf_posext.patch_model(model, "alibi", backend=backend)
    got = logits(model, ids, attention_mask=mask).float()
    native = tiny_model("mistral", max_positions=8).cuda()
    native_error = (logits(native.to(torch.bfloat16), ids).float() - logits(native.float(), ids)).abs().max()
    assert (got[0] - expected[0]).abs().max() <= 3 * native_error
    assert (got[1, -40:] - expected[1, -40:]).abs().max() <= 3 * native_error
