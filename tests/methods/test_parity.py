"""Every RoPE method against transformers' own implementation, or a slow reference from the paper.

Native references are built independently of hf-posext: a config of the same architecture with
the rope parameters a user would write by hand, loaded with the same weights.
"""

from __future__ import annotations

import math

import pytest
import torch
from tests.helpers.models import ARCHITECTURES, tiny_config, tiny_model, tokens
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posext
from hf_posext.methods.yarn.rope import compute_dynamic_yarn_parameters
from hf_posext.rope_utils import default_inv_freq, yarn_inv_freq, yarn_mscale

FACTORS = [1.5, 2, 4, 8, 16, 32]
HEAD_DIMS = [32, 64, 128]
L_ORIG = 64
THETA = 10000.0
TOL = 1e-5
# Dynamic methods default to exact KV-cache semantics (hf_posext.attention.exact_dynamic), under which each
# token uses the frequencies of its own prefix length. Parity with transformers (one scale s(L) for
# every position of a length-L forward) is the ``exact_cache=False`` behaviour.
TRANSFORMERS_SEMANTICS = {"dynamic_ntk": {"exact_cache": False}, "dynamic_yarn": {"exact_cache": False}}


def native_rope(method: str, factor: float, head_dim: int) -> tuple[dict, int]:
    """(rope_parameters, max_position_embeddings) a user would write for transformers' native type."""
    if method == "linear":
        return {"rope_type": "linear", "factor": factor, "rope_theta": THETA}, int(factor * L_ORIG)
    if method == "ntk":
        # YaRN paper eq. 16, written out here rather than taken from hf_posext
        return {"rope_type": "default", "rope_theta": THETA * factor ** (head_dim / (head_dim - 2))}, int(
            factor * L_ORIG
        )
    if method == "dynamic_ntk":
        return {"rope_type": "dynamic", "factor": factor, "rope_theta": THETA}, L_ORIG
    if method == "yarn":
        params = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L_ORIG}
        return {**params, "rope_theta": THETA}, int(factor * L_ORIG)
    raise AssertionError(method)


def native_model(arch: str, method: str, factor: float, head_dim: int, state_dict: dict):
    rope_parameters, max_positions = native_rope(method, factor, head_dim)
    config = tiny_config(
        arch, head_dim=head_dim, rope_parameters=rope_parameters, max_position_embeddings=max_positions
    )
    _, model_cls = ARCHITECTURES[arch]
    model = model_cls(config).eval()
    model.load_state_dict(state_dict)
    return model


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("method", ["linear", "ntk", "dynamic_ntk", "yarn"])
def test_patched_logits_equal_native(arch, head_dim, method):
    ids = tokens(3 * L_ORIG)
    for factor in FACTORS:
        patched = tiny_model(arch, head_dim=head_dim, max_positions=L_ORIG)
        native = native_model(arch, method, factor, head_dim, patched.state_dict())
        hf_posext.patch_model(patched, method, factor=factor, **TRANSFORMERS_SEMANTICS.get(method, {}))
        with torch.no_grad():
            error = (patched(ids).logits - native(ids).logits).abs().max().item()
        assert error <= TOL, f"{arch} {method} factor={factor} head_dim={head_dim}: max |diff| {error:.2e}"


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("original", [64, 2048, 4096])
@pytest.mark.parametrize("betas", [(32, 1), (128, 2)])
def test_yarn_frequencies_equal_transformers(factor, head_dim, original, betas):
    """The frequency maths dynamic YaRN reuses is transformers' ``yarn`` at a fixed scale."""
    rope_parameters = {
        "rope_type": "yarn",
        "rope_theta": THETA,
        "factor": factor,
        "original_max_position_embeddings": original,
        "beta_fast": betas[0],
        "beta_slow": betas[1],
    }
    config = tiny_config(
        head_dim=head_dim, rope_parameters=rope_parameters, max_position_embeddings=int(factor * original)
    )
    expected, expected_mscale = ROPE_INIT_FUNCTIONS["yarn"](config)
    ours = yarn_inv_freq(THETA, head_dim, factor, original, beta_fast=betas[0], beta_slow=betas[1])
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=0)
    assert yarn_mscale(factor) == pytest.approx(expected_mscale, rel=1e-12)


def paper_yarn(theta: float, d: int, s: float, L: int, beta_fast: float = 32, beta_slow: float = 1):
    """YaRN written from arXiv 2309.00071 eqs. 17-22, one pair at a time in float64.

    Pair i has wavelength lambda_i = 2 pi theta^(2i/d) and makes r_i = L / lambda_i turns. The
    ramp runs from the pair where r = beta_fast to the pair where r = beta_slow, those pair
    positions floored/ceiled to whole pairs as in the authors' code.
    """
    if s <= 1:
        return [theta ** (-2 * i / d) for i in range(d // 2)], 1.0

    def pair_index(turns):  # solve L / (2 pi theta^(2i/d)) = turns for i
        return d * math.log(L / (2 * math.pi * turns)) / (2 * math.log(theta))

    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    freqs = []
    for i in range(d // 2):
        keep = 1 - min(max((i - low) / (high - low), 0.0), 1.0)  # gamma_i: 1 = extrapolate
        base = theta ** (-2 * i / d)
        freqs.append((1 - keep) * base / s + keep * base)
    return freqs, 0.1 * math.log(s) + 1


def with_frequencies(model, freqs, mscale):
    rotary = model.model.rotary_emb
    rotary.inv_freq = torch.tensor(freqs, dtype=torch.float32)
    rotary.attention_scaling = mscale
    return model


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_dynamic_yarn_equals_paper_reference(arch, head_dim):
    """A fresh forward over L tokens uses s(L) = min(factor, max(1, L / L_orig)) at every position
    (transformers' semantics, ``exact_cache=False``; the exact-cache semantics are tested in
    tests/attention/exact_dynamic/test_exact_dynamic.py).

    The reference's float64 frequencies differ from any fp32 computation by rounding, which long
    positions amplify; the tolerance is the error transformers' own static ``yarn`` at s(L) shows
    against the same reference (the fp32 baseline), never less than 1e-5.
    """
    factor = 4
    for length in [L_ORIG // 2, L_ORIG, L_ORIG + 1, 3 * L_ORIG, 5 * L_ORIG]:
        ids = tokens(length)
        patched = hf_posext.patch_model(
            tiny_model(arch, head_dim=head_dim, max_positions=L_ORIG), "dynamic_yarn", factor=factor, exact_cache=False
        )
        scale = min(factor, max(1.0, length / L_ORIG))
        reference = with_frequencies(
            tiny_model(arch, head_dim=head_dim, max_positions=L_ORIG), *paper_yarn(THETA, head_dim, scale, L_ORIG)
        )
        tolerance = TOL
        with torch.no_grad():
            expected = reference(ids).logits
            if scale > 1:
                baseline = native_model(arch, "yarn", scale, head_dim, reference.state_dict())
                tolerance = max(TOL, 2 * (baseline(ids).logits - expected).abs().max().item())
            error = (patched(ids).logits - expected).abs().max().item()
        assert error <= tolerance, f"{arch} head_dim={head_dim} L={length}: max |diff| {error:.2e} > {tolerance:.2e}"


def test_dynamic_yarn_init_function_contract():
    config = tiny_config(max_positions=L_ORIG)
    hf_posext.patch_model(config, "dynamic_yarn", factor=8, beta_fast=64, beta_slow=2)
    for seq_len, scale in [(None, 1.0), (L_ORIG, 1.0), (2 * L_ORIG, 2.0), (100 * L_ORIG, 8.0)]:
        inv_freq, mscale = compute_dynamic_yarn_parameters(config, seq_len=seq_len)
        freqs, expected_mscale = paper_yarn(THETA, 32, scale, L_ORIG, 64, 2)
        torch.testing.assert_close(inv_freq, torch.tensor(freqs, dtype=torch.float32), rtol=1e-6, atol=0)
        assert mscale == pytest.approx(expected_mscale)
    config.rope_parameters["attention_factor"] = 1.25
    assert compute_dynamic_yarn_parameters(config, seq_len=4 * L_ORIG)[1] == 1.25


def test_yarn_blends_frequencies_and_sharpens_attention():
    """Frequencies are blended (eq. 20): per-pair scales run monotonically from 1 (fast pairs) to
    s (slow pairs), and the q.k logits grow by mscale^2 = 1.296 at s=4 (eq. 22).

    Note: the paper's eq. 18 ramps linearly in the turn count r_i, which scales pair 26 of d=128
    at s=4, L=4096 by 1.67x; the authors' code and transformers ramp linearly in the pair index
    between floored/ceiled bounds (pairs 20..46), giving that pair 1.209x (pair 27: 1.25x).
    hf-posext follows the code, so its checkpoints mean the same in transformers and vLLM.
    """
    freqs = yarn_inv_freq(THETA, 128, 4.0, 4096)
    scales = default_inv_freq(THETA, 128) / freqs
    assert scales[0].item() == pytest.approx(1.0) and scales[-1].item() == pytest.approx(4.0)
    assert bool((scales[1:] >= scales[:-1] - 1e-6).all())
    assert scales[26].item() == pytest.approx(1 / ((6 / 26) / 4 + (20 / 26)), rel=1e-5)  # ramp over pairs 20..46
    assert yarn_mscale(4.0) ** 2 == pytest.approx(1.296, abs=0.001)
