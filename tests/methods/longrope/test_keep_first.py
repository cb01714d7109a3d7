"""LongRoPE's first n positions on plain RoPE (``keep_first``, the paper's n-hat; docs/methods/longrope.md).

The reference is written from the paper (Ding et al. 2024, arXiv:2402.13753, sec. 3.2) and
microsoft/LongRoPE's start-token embedding, in float64 and one position at a time: past L_orig a
position p < n turns pair i by p * theta^(-2i/d) with cos/sin multiplier 1, a position p >= n by
p * theta^(-2i/d) / long_i with the attention factor; up to L_orig every position takes the short
factors (transformers' ``longrope``). The fast paths (the rotary module, by default and with
``exact_cache=False``; the exact cache of ``factors_by="query"``) are compared with it, and with each
other through cached decoding.
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from tests.helpers.models import published_model, tiny_model, tokens
from scripts.registry import tiny_config as registry_config
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.attention.exact_dynamic import ExactDynamicRotaryEmbedding
from hf_posext.methods.longrope import LongRopeRotaryEmbedding
from hf_posext.rope_utils import LONGROPE_KEEP_FIRST_ROPE_TYPE

pytestmark = pytest.mark.usefixtures("one_thread")

L_ORIG = 16
FACTOR = 4
N = 5
TOL = 1e-5
#: fp32's unit roundoff: the fast paths compute angles and cos/sin in fp32
U32 = 2.0**-24


def reference_tables(params: dict, rotary_dim: int, positions: range, seq_len: int) -> tuple[torch.Tensor, ...]:
    """``(cos, sin, angles)`` ``[len(positions), rotary_dim // 2]`` float64, one position at a time, from the paper."""
    theta, original = float(params["rope_theta"]), int(params["original_max_position_embeddings"])
    n = int(params.get("keep_first", 0))
    attention = float(params["attention_factor"])
    plain = torch.tensor([theta ** (-2 * i / rotary_dim) for i in range(rotary_dim // 2)], dtype=torch.float64)
    long = torch.tensor(params["long_factor"], dtype=torch.float64)
    short = torch.tensor(params["short_factor"], dtype=torch.float64)
    cos, sin, angles = [], [], []
    for p in positions:
        if seq_len <= original:
            omega, scale = plain / short, attention
        elif p < n:
            omega, scale = plain, 1.0  # the first n positions: the pretrained model's own RoPE
        else:
            omega, scale = plain / long, attention
        angle = p * omega
        angles.append(angle)
        cos.append(scale * torch.cos(angle))
        sin.append(scale * torch.sin(angle))
    return torch.stack(cos), torch.stack(sin), torch.stack(angles)


def reference_model(model, params: dict, rotary_dim: int):
    """``model`` (unpatched weights) whose rotary module returns :func:`reference_tables` for each forward."""
    reference = copy.deepcopy(model)
    hf_posext.unpatch_model(reference)
    rotary = reference.model.rotary_emb

    def forward(x, position_ids):
        positions = position_ids[0].tolist()
        assert positions == list(range(positions[0], positions[0] + len(positions)))
        cos, sin, _ = reference_tables(params, rotary_dim, range(len(positions)), positions[-1] + 1)
        cos, sin = cos[positions[0] :], sin[positions[0] :]
        return (torch.cat((cos, cos), -1)[None].to(x.dtype), torch.cat((sin, sin), -1)[None].to(x.dtype))

    rotary.forward = forward
    return reference


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def cached_steps(model, ids, prompt):
    """Each decoding step's logits after a ``prompt``-token prefill: ``[batch, seq - prompt, vocab]``."""
    with torch.no_grad():
        out = model(ids[:, :prompt], use_cache=True)
        cache, steps = out.cache, [out.logits[:, -1]]
        for t in range(prompt, ids.shape[1] - 1):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.logits[:, -1])
    return torch.stack(steps, dim=1)


def keep_first_model(arch="llama", keep_first=N, exact_cache=False, factors_by="sequence", **kwargs):
    return hf_posext.patch_model(
        tiny_model(arch, max_positions=L_ORIG, **kwargs),
        "longrope",
        factor=FACTOR,
        keep_first=keep_first,
        exact_cache=exact_cache,
        factors_by=factors_by,
    )


def last_rows(model, ids, start):
    """The last row of a forward over each prefix ``ids[:, :t + 1]`` from ``t = start - 1``: ``[batch, n, vocab]``."""
    return torch.stack([logits(model, ids[:, : t + 1])[:, -1] for t in range(start - 1, ids.shape[1] - 1)], dim=1)


def stablelm_partial():
    """A tiny StableLM rotating half of each head (partial_rotary_factor 0.5: 8 pairs of head_dim 32)."""
    config = registry_config(
        "stablelm",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        max_position_embeddings=L_ORIG,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(4.0)
    return model


def test_rope_parameters_carry_n_under_hf_posexts_own_type():
    model = keep_first_model()
    params = model.config.rope_parameters
    assert params["rope_type"] == LONGROPE_KEEP_FIRST_ROPE_TYPE and params["keep_first"] == N
    assert "short_mscale" not in params and "long_mscale" not in params  # vLLM's keys: no reader runs this type
    assert model.config.hf_posext["keep_first"] == N
    assert hf_posext.patched_method(model).keep_first == N


@pytest.mark.parametrize("seq_len", (L_ORIG, 3 * L_ORIG))
def test_the_rotary_tables_equal_the_papers_position_by_position(seq_len):
    """Fast path (transformers' rotary module run per set, the kept rows swapped in) against float64, per position."""
    model = keep_first_model()
    rotary = model.model.rotary_emb
    assert isinstance(rotary, LongRopeRotaryEmbedding)
    cos, sin = rotary(torch.zeros(1), torch.arange(seq_len)[None])
    ref_cos, ref_sin, angles = reference_tables(model.config.rope_parameters, 32, range(seq_len), seq_len)
    # fp32 rounds each angle (and its frequency) to a relative 2^-24, then cos/sin and the multiplier
    bound = 4 * U32 * (angles.abs() + 1) * model.config.rope_parameters["attention_factor"]
    for half in (slice(0, 16), slice(16, 32)):
        for fast, ref in ((cos, ref_cos), (sin, ref_sin)):
            error = (fast[0, :, half].double() - ref).abs()
            assert bool((error <= bound).all()), (error / bound).max()


def test_the_exact_caches_tables_equal_the_papers():
    """The exact cache's own tables (its plan for a prompt past the switch) against the float64 reference."""
    model = keep_first_model(exact_cache=True, factors_by="query")
    stand_in = model.model.rotary_emb
    assert isinstance(stand_in, ExactDynamicRotaryEmbedding)
    rope, seq = stand_in.rope, 3 * L_ORIG
    positions = torch.arange(seq)[None]
    plan = rope.plan(positions, 1)
    params = model.config.rope_parameters
    for call in plan.calls:  # rows up to L_orig (short factors), rows past it (long, the first n kept)
        cos, sin = rope.cos_sin(call, positions, torch.float32)  # every position, as that call's rows see them
        ref_cos, ref_sin, angles = reference_tables(params, 32, range(seq), L_ORIG if call.kept is None else seq)
        bound = 4 * U32 * (angles.abs() + 1) * params["attention_factor"]
        for fast, ref in ((cos, ref_cos), (sin, ref_sin)):
            error = (fast[0].double() - ref).abs()
            assert bool((error <= bound).all()), (error / bound).max()
    assert [call.kept is not None for call in plan.calls] == [False, True]
    # past the switch, plain decoding
    cos, sin = rope.rotary_tables(rope.saturation, torch.arange(seq)[None], torch.float32)
    ref_cos, _, _ = reference_tables(params, 32, range(seq), seq)
    assert bool(((cos[0, :, :16].double() - ref_cos).abs() <= bound).all())


@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_full_forward_equals_the_reference_model(arch):
    """exact_cache=False: the whole sequence past L_orig with the first n positions on plain RoPE, as the reference."""
    model = keep_first_model(arch)
    reference = reference_model(model, model.config.rope_parameters, 32)
    ids = tokens(3 * L_ORIG)
    for length in (L_ORIG, L_ORIG + 1, 3 * L_ORIG):
        torch.testing.assert_close(logits(model, ids[:, :length]), logits(reference, ids[:, :length]), rtol=0, atol=TOL)


def test_exact_cache_is_the_per_row_reference():
    """exact_cache=True (one layer): row i attends with the set of length i + 1 (hf-posext's causal definition),
    i.e. the last row of the reference model's forward over ids[:i + 1]."""
    model = keep_first_model(exact_cache=True, factors_by="query", layers=1)
    reference = reference_model(model, model.config.rope_parameters, 32)
    ids = tokens(3 * L_ORIG)
    full = logits(model, ids)
    for i in range(ids.shape[1]):
        torch.testing.assert_close(full[:, i], logits(reference, ids[:, : i + 1])[:, -1], rtol=0, atol=TOL)


@pytest.mark.parametrize("factors_by", ("sequence", "query"))
@pytest.mark.parametrize("arch", ("llama", "mistral", "qwen3", "stablelm-partial"))
def test_cached_decoding_across_the_switch_equals_full_forward(arch, factors_by):
    if arch == "stablelm-partial":
        model = hf_posext.patch_model(
            stablelm_partial(), "longrope", factor=FACTOR, keep_first=N, factors_by=factors_by
        )
    else:
        model = keep_first_model(arch, exact_cache=True, factors_by=factors_by)
    ids = tokens(3 * L_ORIG)
    full = last_rows(model, ids, N - 2)  # each step: the last row of a forward over its prefix
    if factors_by == "query":  # one forward computes every prefix's last row
        torch.testing.assert_close(full, logits(model, ids)[:, N - 3 : -1], rtol=0, atol=TOL)
    # a prompt before the switch, one past it, one shorter than n
    for prompt in (L_ORIG - 5, 2 * L_ORIG, N - 2):
        torch.testing.assert_close(cached_steps(model, ids, prompt), full[:, prompt - N + 2 :], rtol=0, atol=TOL)


@pytest.mark.parametrize("factors_by", ("sequence", "query"))
def test_decoding_under_autograd_takes_the_general_path_and_stays_exact(factors_by):
    """With gradients the cache's keys are never rotated in place: a decoding step past the switch rotates
    its kept keys with plain RoPE itself (the offset-only decoding path cannot: they are not relative)."""
    model = keep_first_model(exact_cache=True, factors_by=factors_by)
    ids = tokens(2 * L_ORIG)
    out = model(ids[:, : L_ORIG + 2], use_cache=True)
    cache = out.cache
    for t in range(L_ORIG + 2, L_ORIG + 6):
        out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
        cache = out.cache
        torch.testing.assert_close(out.logits[:, -1].detach(), logits(model, ids[:, : t + 1])[:, -1], rtol=0, atol=TOL)


@pytest.mark.parametrize("factors_by", ("sequence", "query"))
def test_a_cache_cropped_back_before_the_switch_stays_exact(factors_by):
    """Keys rotated past the switch (the first n with plain RoPE) are un-rotated, or computed again by default,
    when the cache is cropped back."""
    model = keep_first_model(exact_cache=True, factors_by=factors_by)
    ids = tokens(2 * L_ORIG)
    with torch.no_grad():
        cache = model(ids[:, : L_ORIG + 4], use_cache=True).cache
        cache = model(ids[:, L_ORIG + 4 : L_ORIG + 5], cache=cache, use_cache=True).cache  # past the switch
        cache.crop(-11)
        for t in range(L_ORIG - 6, 2 * L_ORIG - 1):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            torch.testing.assert_close(out.logits[:, -1], logits(model, ids[:, : t + 1])[:, -1], rtol=0, atol=TOL)


def test_without_the_exact_cache_decoding_past_the_switch_equals_full_forward():
    """exact_cache=False, a prompt past L_orig: the cache holds the kept keys on plain RoPE, as the full forward."""
    model = keep_first_model()
    ids = tokens(3 * L_ORIG)
    torch.testing.assert_close(
        cached_steps(model, ids, L_ORIG + 3), logits(model, ids)[:, L_ORIG + 2 : -1], rtol=0, atol=TOL
    )


@pytest.mark.parametrize("model_type", ("llama", "cohere", "deepseek_v2", "llama4_text", "qwen3_5_text", "stablelm"))
def test_the_rotary_wrapper_keeps_each_architectures_layout(model_type):
    """exact_cache=False on any rotary layout (rotate-half, interleaved, complex tables, 3D positions, partial):
    past the switch the kept rows are the unpatched model's own tables, the others transformers' longrope's."""
    from scripts.registry import L_ORIG as REGISTRY_L_ORIG
    from scripts.registry import build

    from hf_posext import integration

    config = registry_config(model_type, layers=1)
    kept = hf_posext.patch_model(build(config), "longrope", factor=FACTOR, keep_first=N, exact_cache=False)
    wrapper = next(m for m in kept.modules() if isinstance(m, LongRopeRotaryEmbedding))
    others = [hf_posext.patch_model(build(config), "longrope", factor=FACTOR, exact_cache=False), build(config)]
    longrope, plain = (next(integration.rotary_modules(model))[1] for model in others)
    positions = torch.arange(2 * REGISTRY_L_ORIG + 8)[None]
    if model_type == "qwen3_5_text":  # its model hands the rotary module [sections, batch, seq] positions
        positions = positions[None].expand(3, -1, -1)
    x = torch.zeros(1)
    with torch.no_grad():
        tables, long_tables, plain_tables = (module(x, positions) for module in (wrapper, longrope, plain))
    tables, long_tables, plain_tables = (
        (t,) if isinstance(t, torch.Tensor) else t for t in (tables, long_tables, plain_tables)
    )
    for ours, long, own in zip(tables, long_tables, plain_tables, strict=True):
        assert torch.equal(ours[:, :N], own[:, :N]) and torch.equal(ours[:, N:], long[:, N:])
        assert not torch.equal(own[:, N:], long[:, N:])


def test_keep_first_0_is_todays_longrope():
    ids = tokens(3 * L_ORIG)
    for exact in (False, True):
        today = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "longrope", factor=FACTOR, exact_cache=exact)
        zero = keep_first_model(keep_first=0, exact_cache=exact)
        assert zero.config.rope_parameters == today.config.rope_parameters
        assert zero.config.rope_parameters["rope_type"] == "longrope"
        assert type(zero.model.rotary_emb) is type(today.model.rotary_emb)
        assert torch.equal(logits(zero, ids), logits(today, ids))
        assert torch.equal(cached_steps(zero, ids, L_ORIG - 3), cached_steps(today, ids, L_ORIG - 3))


def test_up_to_l_orig_it_is_longrope():
    """The kept positions differ only past the switch: up to L_orig every position takes the short factors."""
    ids = tokens(L_ORIG)
    for exact in (False, True):
        plain = keep_first_model(keep_first=0, exact_cache=exact)
        assert torch.equal(logits(keep_first_model(exact_cache=exact), ids), logits(plain, ids))
        assert not torch.allclose(
            logits(keep_first_model(exact_cache=exact), tokens(2 * L_ORIG)),
            logits(plain, tokens(2 * L_ORIG)),
            atol=1e-3,
        )


@pytest.mark.parametrize(("exact", "factors_by"), [(False, "sequence"), (True, "sequence"), (True, "query")])
def test_save_reload_round_trips_and_vanilla_transformers_refuses(tmp_path, exact, factors_by):
    from scripts.vanilla import vanilla_load_error

    model = keep_first_model(exact_cache=exact, factors_by=factors_by)
    model.save_pretrained(tmp_path / "kf")
    reloaded = hf_posext.from_pretrained(tmp_path / "kf", attn_implementation="eager")
    assert reloaded.config.rope_parameters["keep_first"] == N and reloaded.config.hf_posext["keep_first"] == N
    stand_in = ExactDynamicRotaryEmbedding if factors_by == "query" else LongRopeRotaryEmbedding
    assert isinstance(reloaded.model.rotary_emb, stand_in)
    ids = tokens(3 * L_ORIG)
    assert torch.equal(logits(reloaded, ids), logits(model, ids))
    if factors_by == "query":
        error = vanilla_load_error(tmp_path / "kf")
        assert "KeyError" in error and LONGROPE_KEEP_FIRST_ROPE_TYPE in error


def test_unpatch_and_repatch_leave_no_wrapper():
    model = keep_first_model()
    before = logits(tiny_model(max_positions=L_ORIG), tokens(20))
    hf_posext.patch_model(model, "longrope", factor=FACTOR)  # re-patch without keep_first
    assert not any(isinstance(m, LongRopeRotaryEmbedding) and m.keep_first for m in model.modules())
    hf_posext.patch_model(model, "longrope", factor=FACTOR, keep_first=N, exact_cache=False)
    hf_posext.unpatch_model(model)
    assert not any(isinstance(m, (LongRopeRotaryEmbedding, ExactDynamicRotaryEmbedding)) for m in model.modules())
    assert torch.equal(logits(model, tokens(20)), before)


@pytest.mark.parametrize(
    ("keep_first", "message"),
    [
        (-1, r"keep_first must be an int >= 0 \(positions kept on plain RoPE\), got -1"),
        (1.5, r"keep_first must be an int >= 0 .*got 1.5"),
        (True, r"keep_first must be an int >= 0 .*got True"),
        ("3", r"keep_first must be an int >= 0 .*got '3'"),
        (L_ORIG, r"keep_first must be an int in \[0, 15\] .*original context 16\), got 16"),
        (10**6, r"keep_first must be an int in \[0, 15\] .*got 1000000"),
    ],
)
def test_bad_values_are_one_clear_error(keep_first, message):
    model = tiny_model(max_positions=L_ORIG)
    with pytest.raises(ValueError, match=message):
        hf_posext.patch_model(model, "longrope", factor=FACTOR, keep_first=keep_first)
    assert model.config.rope_parameters["rope_type"] == "default"


def test_on_a_shipped_scaling_it_needs_override():
    model = published_model("phi-3-mini-128k")
    with pytest.raises(ValueError, match="keep_first keeps positions on plain RoPE.*override=True"):
        hf_posext.patch_model(model, "longrope", keep_first=4)
    with pytest.raises(ValueError, match="keep_first keeps positions on plain RoPE.*override=True"):
        hf_posext.patch_model(model, "longrope", factor=2, keep_first=4)
    hf_posext.patch_model(model, "longrope", factor=2, keep_first=4, override=True)  # on plain RoPE, L_orig 4096
    assert model.config.rope_parameters["keep_first"] == 4
    assert model.config.rope_parameters["original_max_position_embeddings"] == 4096


def test_phi3_models_refuse_the_type_by_name():
    """transformers' Phi3Config accepts no rope type but default and longrope: patch_model says so, nothing changes."""
    config = registry_config("phi3", max_position_embeddings=L_ORIG)
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ValueError, match="model_type 'phi3' does not accept the rope parameters"):
        hf_posext.patch_model(model, "longrope", factor=2, keep_first=4)
    assert model.config.rope_parameters["rope_type"] == "default"


def test_a_hand_written_config_is_validated_on_load(tmp_path):
    model = keep_first_model(exact_cache=False)
    model.save_pretrained(tmp_path / "kf")
    config_file = tmp_path / "kf" / "config.json"
    raw = json.loads(config_file.read_text())
    for field in ("rope_parameters", "rope_scaling"):  # transformers 5 reads the legacy field first
        raw[field]["keep_first"] = L_ORIG + 3
    config_file.write_text(json.dumps(raw))
    # checked as written, before transformers reads it (which would wrap its validator's error in two lines)
    expected = r"kf/config.json: rope_parameters\['keep_first'\] must be an int in \[0, 15\].*got 19"
    with pytest.raises(ValueError, match=expected):
        hf_posext.from_pretrained(tmp_path / "kf")


def test_readers_refuse_it_and_the_gguf_writer_names_why():
    from hf_posext import readers
    from hf_posext.gguf.rope import gguf_rope_for

    config = keep_first_model().config
    verdicts = readers.support(config, FACTOR * L_ORIG)
    assert verdicts["transformers 5"][0] == "same" and "import hf_posext" in verdicts["transformers 5"][1]
    assert verdicts["transformers 4.57"][0] == verdicts["vLLM"][0] == verdicts["SGLang"][0] == "refused"
    assert verdicts["llama.cpp"][0] == "misread"  # the converter logs "Unknown RoPE type" and writes plain RoPE
    with pytest.raises(ValueError, match="keep_first.*no GGUF form: llama.cpp has no position-dependent"):
        gguf_rope_for(config, "llama")
    assert math.isfinite(config.rope_parameters["attention_factor"])
