"""Composition: a static method applied on top of the scaling a checkpoint already ships.

Tiny models with the rope settings of published checkpoints (tests/helpers/models.py PUBLISHED); the
float64 references below are written from the rules in hf_posext.methods' docstrings, not from
the code under test.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tests.helpers.models import PUBLISHED, published_model, tiny_model, tokens
from scripts.vanilla import vanilla_logits

import hf_posext
from hf_posext.commands.main import main as cli_main

COMPOSED_BASES = ["llama-3.1", "qwen2.5", "phi-3-mini-128k", "linear"]
STATIC_METHODS = ["linear", "ntk", "yarn"]


def base_model(name: str, seed: int = 0):
    if name == "linear":  # a CodeLlama-style linear 4 checkpoint that advertises its reach
        return tiny_model(
            head_dim=64,
            heads=2,
            kv_heads=1,
            max_positions=16384,
            seed=seed,
            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        )
    return published_model(name, seed=seed)


def reach_of(name: str) -> int:
    return {"llama-3.1": 131072, "qwen2.5": 131072, "phi-3-mini-128k": 131072, "linear": 16384}[name]


def rotary(model):
    return model.model.rotary_emb


def run_rotary(model, position: int):
    """Run the rotary module at ``position`` (longrope picks its factor set from the length)."""
    module = rotary(model)
    x = torch.zeros(1, 1, 1)
    cos, sin = module(x, torch.tensor([[position]]))
    return module.inv_freq.clone(), float(module.attention_scaling), cos, sin


# --- float64 reference, from the rules -------------------------------------------------------------


def reference_base(params: dict, rotary_dim: int, max_positions: int) -> tuple[np.ndarray, float]:
    """The shipped scaling's frequencies past its original context, float64, from each type's definition."""
    theta = params["rope_theta"]
    plain = theta ** -(np.arange(0, rotary_dim, 2) / rotary_dim)
    kind = params["rope_type"]
    if kind == "linear":
        return plain / params["factor"], 1.0
    if kind == "llama3":  # Llama 3.1 reference code: apply_scaling
        s, lo, hi, old = (
            params["factor"],
            params["low_freq_factor"],
            params["high_freq_factor"],
            params["original_max_position_embeddings"],
        )
        out = []
        for w in plain:
            wavelen = 2 * math.pi / w
            if wavelen < old / hi:
                out.append(w)
            elif wavelen > old / lo:
                out.append(w / s)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                out.append((1 - smooth) * w / s + smooth * w)
        return np.array(out), 1.0
    if kind == "yarn":  # YaRN eqs. 17-22 with the reference code's ramp in the pair index
        s, old = params["factor"], params["original_max_position_embeddings"]
        low = math.floor(rotary_dim * math.log(old / (2 * math.pi * 32)) / (2 * math.log(theta)))
        high = math.ceil(rotary_dim * math.log(old / (2 * math.pi * 1)) / (2 * math.log(theta)))
        gamma = 1 - np.clip((np.arange(rotary_dim // 2) - low) / (high - low), 0, 1)
        return plain / s * (1 - gamma) + plain * gamma, 0.1 * math.log(s) + 1
    if kind == "longrope":  # Phi-3: long factors past the original context, sqrt(1 + ln s / ln L)
        old = params["original_max_position_embeddings"]
        s = max_positions / old
        return plain / np.array(params["long_factor"]), math.sqrt(1 + math.log(s) / math.log(old))
    raise AssertionError(kind)


def crossing(log_turns: np.ndarray, target: float) -> float:
    """Where the piecewise-linear ln r(i), extended along its end segments, equals ``target``."""
    n = len(log_turns)
    if target > log_turns[0]:
        return (target - log_turns[0]) / (log_turns[1] - log_turns[0])
    if target < log_turns[-1]:
        return n - 1 + (target - log_turns[-1]) / (log_turns[-1] - log_turns[-2])
    return float(np.interp(target, log_turns[::-1], np.arange(n)[::-1]))


def reference_composed(method: str, s: float, omega: np.ndarray, attention: float, reach: int):
    """The rule of each method family on base frequencies ``omega`` reaching ``reach``."""
    d = 2 * len(omega)
    pairs = np.arange(len(omega))
    if method == "linear":
        return omega / s, attention
    if method == "ntk":
        return omega / s ** (2 * pairs / (d - 2)), attention
    log_turns = np.log(reach * omega / (2 * math.pi))
    low = max(math.floor(crossing(log_turns, math.log(32))), 0)
    high = min(math.ceil(crossing(log_turns, math.log(1))), d - 1)
    gamma = 1 - np.clip((pairs - low) / (high - low), 0, 1)
    return omega / s * (1 - gamma) + omega * gamma, attention * (0.1 * math.log(s) + 1)


@pytest.mark.parametrize("method", STATIC_METHODS)
@pytest.mark.parametrize("name", COMPOSED_BASES)
def test_composed_frequencies_equal_the_float64_reference(name, method):
    model = base_model(name)
    config = model.config
    shipped = dict(config.rope_parameters)
    rotary_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    omega, attention = reference_base(shipped, rotary_dim, config.max_position_embeddings)
    base_inv, base_scale, _, _ = run_rotary(model, reach_of(name) - 1)
    # the baseline: transformers' own fp32 frequencies of the shipped scaling against the reference
    np.testing.assert_allclose(base_inv.double().numpy(), omega, rtol=1e-6)
    assert base_scale == pytest.approx(attention, rel=1e-12)

    hf_posext.patch_model(model, method, factor=4)
    if method == "linear" and name == "linear":
        # native linear keeps the readers' convention: they derive max_position_embeddings x factor
        assert model.config.max_position_embeddings * model.config.rope_parameters["factor"] == 4 * reach_of(name)
    else:
        assert model.config.max_position_embeddings == 4 * reach_of(name)
    expected, expected_scale = reference_composed(method, 4.0, omega, attention, reach_of(name))
    for position in (0, 4 * reach_of(name) - 1):  # short and long factor sets
        inv, scale, _, _ = run_rotary(model, position)
        np.testing.assert_allclose(inv.double().numpy(), expected, rtol=1e-6)
        assert scale == pytest.approx(expected_scale, rel=1e-12)
    if method == "yarn" or name != "linear":
        assert model.config.rope_parameters["rope_type"] == "longrope"
    assert hf_posext.patch_info(model)["composed_on"] == shipped["rope_type"]


@pytest.mark.parametrize("name", ["llama-3.1", "qwen2.5", "phi-3-mini-128k"])
def test_yarn_keeps_the_base_frequencies_of_its_fast_pairs(name):
    """Pairs making >= beta_fast turns over L0 keep the checkpoint's own frequency, so at positions
    < L0 their cos/sin are the base model's times the new temperature only.

    Kept pairs whose divisor is exact in fp32 (1 for llama3 and yarn, the shipped list for
    longrope) are bit for bit the checkpoint's; the others are within the 2 fp32 ulps of writing
    a yarn blend 1/((1 - g)/s + g) as a longrope divisor."""
    base = base_model(name)
    composed = hf_posext.patch_model(base_model(name), "yarn", factor=4)
    base_inv, base_scale, _, _ = run_rotary(base, reach_of(name) - 1)
    turns = reach_of(name) * base_inv.double() / (2 * math.pi)
    kept = int((turns >= 32).sum())
    assert 0 < kept < len(turns)
    divisors = torch.tensor(composed.config.rope_parameters["long_factor"])
    if name == "phi-3-mini-128k":  # longrope: the kept pairs keep the shipped long factors, exactly
        shipped = torch.tensor(base.config.rope_parameters["long_factor"])
        assert torch.equal(divisors[:kept], shipped[:kept]) and not torch.equal(divisors, shipped)
        exact = kept
    else:
        exact = int((divisors[:kept] == 1).sum())
        assert exact > 0 and bool((divisors[:exact] == 1).all())
    # Phi-3 runs its short factors below 4096: the composition starts from the long ones (see yarn.py)
    for position in (5000, reach_of(name) - 1) if name == "phi-3-mini-128k" else (17, 4096, reach_of(name) - 1):
        _, _, base_cos, base_sin = run_rotary(base, position)
        inv, scale, cos, sin = run_rotary(composed, position)
        torch.testing.assert_close(inv[:kept], base_inv[:kept], rtol=2.4e-7, atol=0)
        assert torch.equal(inv[:exact], base_inv[:exact])
        assert not torch.allclose(inv[kept:], base_inv[kept:])
        for new, old in ((cos, base_cos), (sin, base_sin)):
            torch.testing.assert_close(new[..., :exact] / scale, old[..., :exact] / base_scale, rtol=0, atol=1e-6)
    assert scale == pytest.approx(base_scale * (0.1 * math.log(4) + 1), rel=1e-12)


@pytest.mark.parametrize("name", ["mistral-7b-v0.1", "mistral-7b-v0.3"])
@pytest.mark.parametrize("method", STATIC_METHODS)
def test_a_plain_checkpoint_is_extended_by_the_method_alone(name, method):
    """A raised rope_theta is plain RoPE: nothing composes, the method's native entry is written."""
    model = hf_posext.patch_model(published_model(name), method, factor=4)
    info = hf_posext.patch_info(model)
    assert "composed_on" not in info
    assert model.config.rope_parameters["rope_type"] != "longrope"
    assert info["context_length"] == 4 * 32768


@pytest.mark.parametrize("method", STATIC_METHODS)
def test_composing_on_an_identity_scaling_is_the_method_alone(method):
    """A shipped scaling that changes nothing (linear factor 1) composes to exactly the method on plain RoPE."""
    ids = tokens(48)
    alone = hf_posext.patch_model(tiny_model(max_positions=32), method, factor=4)
    shipped = tiny_model(
        max_positions=32, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 1.0}
    )
    composed = hf_posext.patch_model(shipped, method, factor=4)
    assert composed.config.max_position_embeddings == alone.config.max_position_embeddings
    assert hf_posext.patch_info(composed)["context_length"] == hf_posext.patch_info(alone)["context_length"] == 128
    torch.testing.assert_close(rotary(composed).inv_freq, rotary(alone).inv_freq, rtol=1e-6, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(composed(ids).logits, alone(ids).logits, rtol=0, atol=1e-5)
    if method == "linear":  # linear on linear is written as native linear: bit for bit
        assert composed.config.rope_parameters == alone.config.rope_parameters
        with torch.no_grad():
            assert torch.equal(composed(ids).logits, alone(ids).logits)


def test_linear_then_linear_is_linear_with_the_product_factor():
    ids = tokens(96)
    shipped = tiny_model(
        max_positions=64, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    )
    composed = hf_posext.patch_model(shipped, "linear", factor=3)
    product = hf_posext.patch_model(tiny_model(max_positions=32), "linear", factor=6)
    assert composed.config.rope_parameters == product.config.rope_parameters
    assert composed.config.max_position_embeddings == product.config.max_position_embeddings
    assert hf_posext.patch_info(composed)["context_length"] == hf_posext.patch_info(product)["context_length"] == 192
    with torch.no_grad():
        assert torch.equal(composed(ids).logits, product(ids).logits)


@pytest.mark.parametrize("name", ["llama-3.1", "phi-3-mini-128k"])
def test_cached_generation_equals_a_full_forward(name):
    model = hf_posext.patch_model(base_model(name), "yarn", factor=4)
    ids = tokens(24)
    start = 300000  # far past what the checkpoint reached: the long factor set
    positions = torch.arange(start, start + 24)[None]
    with torch.no_grad():
        full = model(ids, position_ids=positions).logits
        out = model(ids[:, :16], position_ids=positions[:, :16], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        for t in range(16, 24):
            out = model(ids[:, t : t + 1], position_ids=positions[:, t : t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


def test_composed_checkpoints_reload_bit_identically_without_the_plugin(tmp_path):
    ids = tokens(16)
    inputs = [dict(input_ids=ids), dict(input_ids=ids, position_ids=torch.arange(200000, 200016)[None])]
    models = {}
    for name, method in [("llama-3.1", "yarn"), ("qwen2.5", "yarn"), ("phi-3-mini-128k", "ntk"), ("linear", "yarn")]:
        model = hf_posext.patch_model(base_model(name), method, factor=4)
        model.save_pretrained(tmp_path / f"{name}-{method}")
        models[tmp_path / f"{name}-{method}"] = model
    reloaded = vanilla_logits(list(models), inputs, tmp_path)
    for checkpoint, model in models.items():
        with torch.no_grad():
            for kwargs, logits in zip(inputs, reloaded[checkpoint]):
                assert torch.equal(logits, model(**kwargs).logits), checkpoint.name
        saved = json.loads((checkpoint / "config.json").read_text())
        assert saved["rope_parameters"]["rope_type"] == "longrope"
        # vLLM's longrope reads these instead of attention_factor
        rope = saved["rope_parameters"]
        assert rope["short_mscale"] == rope["long_mscale"] == rope["attention_factor"]
        assert saved["max_position_embeddings"] == model.config.max_position_embeddings


def test_unpatch_restores_the_shipped_scaling_and_repatching_composes_on_it_again():
    ids = tokens(32)
    positions = torch.arange(150000, 150032)[None]
    shipped = base_model("llama-3.1")
    with torch.no_grad():
        before = shipped(ids, position_ids=positions).logits
    original = json.dumps(shipped.config.rope_parameters, sort_keys=True)
    hf_posext.patch_model(shipped, "yarn", factor=4)
    hf_posext.patch_model(shipped, "linear", factor=2)  # starts again from llama3, not from the yarn patch
    assert hf_posext.patch_info(shipped)["composed_on"] == "llama3"
    assert shipped.config.max_position_embeddings == 2 * 131072
    hf_posext.unpatch_model(shipped)
    assert json.dumps(shipped.config.rope_parameters, sort_keys=True) == original
    with torch.no_grad():
        assert torch.equal(shipped(ids, position_ids=positions).logits, before)


def test_what_cannot_compose_is_refused_and_override_replaces():
    dynamic = tiny_model(
        max_positions=64, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    )
    with pytest.raises(ValueError, match=r"rope_type='dynamic'.*override=True"):
        hf_posext.patch_model(dynamic, "yarn", factor=4)
    for method in ("dynamic_ntk", "alibi"):
        kwargs = {} if method == "alibi" else {"factor": 4}
        with pytest.raises(ValueError, match=rf"not '{method}' on 'llama3'.*override=True"):
            hf_posext.patch_model(base_model("llama-3.1"), method, **kwargs)
    replaced = hf_posext.patch_model(base_model("llama-3.1"), "yarn", factor=4, override=True)
    assert replaced.config.rope_parameters["rope_type"] == "yarn"
    assert replaced.config.rope_parameters["original_max_position_embeddings"] == 8192
    assert replaced.config.max_position_embeddings == 4 * 8192


def test_cli_patch_composes_on_a_llama_3_1_checkpoint(tmp_path):
    base = base_model("llama-3.1")
    base.save_pretrained(tmp_path / "llama-3.1")
    assert (
        cli_main(["patch", str(tmp_path / "llama-3.1"), str(tmp_path / "out"), "--method", "yarn", "--factor", "4"])
        == 0
    )
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["max_position_embeddings"] == 4 * 131072
    assert config["rope_parameters"]["rope_type"] == "longrope"
    assert config["hf_posext"]["composed_on"] == "llama3"
    card = (tmp_path / "out" / "README.md").read_text()
    assert "from 131072 to 524288 tokens" in card and "composed on its own `llama3` rope scaling" in card
    reloaded = type(base).from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    expected = hf_posext.patch_model(base, "yarn", factor=4)
    ids = tokens(16)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, expected(ids).logits)


@pytest.mark.parametrize("name", ["llama-3.1", "qwen2.5"])
def test_dynamic_yarn_is_the_checkpoint_up_to_l0_and_static_yarn_from_factor_times_l0(name):
    ids = tokens(16)
    base = base_model(name)
    dynamic = hf_posext.patch_model(base_model(name), "dynamic_yarn", factor=4)
    static = hf_posext.patch_model(base_model(name), "yarn", factor=4)
    assert dynamic.config.max_position_embeddings == reach_of(name)  # dynamic methods keep L0
    assert hf_posext.patch_info(dynamic)["context_length"] == 4 * reach_of(name)
    near = torch.arange(reach_of(name) - 16, reach_of(name))[None]
    far = torch.arange(4 * reach_of(name), 4 * reach_of(name) + 16)[None]  # every row past s = factor
    between = torch.arange(2 * reach_of(name) - 16, 2 * reach_of(name))[None]
    with torch.no_grad():
        torch.testing.assert_close(
            dynamic(ids, position_ids=near).logits, base(ids, position_ids=near).logits, rtol=0, atol=1e-5
        )
        torch.testing.assert_close(
            dynamic(ids, position_ids=far).logits, static(ids, position_ids=far).logits, rtol=0, atol=1e-5
        )
        gap = (dynamic(ids, position_ids=between).logits - static(ids, position_ids=between).logits).abs().max()
    assert gap > 1e-3  # at 2 L0 it is YaRN at s = 2, not 4


def test_composed_dynamic_yarn_cached_generation_equals_a_full_forward():
    # Llama 3.1's scaling shrunk to an 8x32 context (L0 = 256): at Llama 3.1's own 2 x 131072 the
    # fp32 angles of absolute positions (full forward) and of offsets (exact decoding) differ by
    # up to 262144 * 6e-8 rad, which says nothing about the method
    llama3 = {**PUBLISHED["llama-3.1"][1]["rope_parameters"], "original_max_position_embeddings": 32}
    model = hf_posext.patch_model(tiny_model(max_positions=128, rope_parameters=llama3), "dynamic_yarn", factor=4)
    assert hf_posext.patch_info(model)["original_max_position_embeddings"] == 256
    ids = tokens(24)
    positions = torch.arange(2 * 256 - 16, 2 * 256 + 8)[None]  # s(L) grows at every step
    with torch.no_grad():
        full = model(ids, position_ids=positions).logits
        out = model(ids[:, :16], position_ids=positions[:, :16], use_cache=True)
        cache, steps = out.past_key_values, [out.logits[:, -1:]]
        for t in range(16, 24):
            out = model(ids[:, t : t + 1], position_ids=positions[:, t : t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full[:, 15:], rtol=0, atol=1e-5)


def test_a_saved_composed_dynamic_yarn_checkpoint_reloads_with_the_plugin(tmp_path):
    llama3 = {**PUBLISHED["llama-3.1"][1]["rope_parameters"], "original_max_position_embeddings": 32}
    model = hf_posext.patch_model(tiny_model(max_positions=128, rope_parameters=llama3), "dynamic_yarn", factor=4)
    model.save_pretrained(tmp_path)
    reloaded = hf_posext.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert hf_posext.patch_info(reloaded)["composed_on"] == "llama3"
    ids = tokens(32)
    positions = torch.arange(600, 632)[None]
    with torch.no_grad():
        assert torch.equal(reloaded(ids, position_ids=positions).logits, model(ids, position_ids=positions).logits)
