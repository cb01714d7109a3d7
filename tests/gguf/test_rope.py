"""The GGUF rope hf-posext writes makes llama.cpp rotate as transformers does (no llama.cpp needed).

:func:`llamacpp_rope` is a float64 reference of what llama.cpp 0.3.36 computes from a GGUF's rope
fields, written from its source (``llama_context``'s constructor: freq_scale, ext_factor and the
attention factor; ggml's ``ggml_rope_yarn_corr_dims`` and ``rope_yarn``; betas 32 / 1, which the
llama graph does not read from the file). The GGUF rope written for each static rope must give
transformers' own frequencies and attention factor; tests/gguf/test_export.py checks the same by
running llama.cpp.
"""

from __future__ import annotations

import math

import pytest
import torch
from tests.helpers.gguf_files import HEAD_DIM, L_ORIG, LLAMA3
from tests.helpers.models import tiny_config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posext
from hf_posext.gguf.rope import GGUFRope, gguf_rope_for, rope_config_of
from hf_posext.rope_utils import default_inv_freq, ntk_theta, rotary_dim_of


def llamacpp_rope(rope: GGUFRope, rotary_dim: int) -> tuple[torch.Tensor, float]:
    """(angle per position for each pair ``[rotary_dim // 2]`` float64, cos/sin multiplier) in llama.cpp."""
    freq_scale = 1.0 / rope.factor if rope.scaling_type in ("linear", "yarn") and rope.factor else 1.0
    ext_factor = 1.0 if rope.scaling_type == "yarn" else 0.0
    mscale = rope.attn_factor
    pairs = torch.arange(rotary_dim // 2, dtype=torch.float64)
    extrap = rope.freq_base ** (-2 * pairs / rotary_dim)
    if rope.rope_freqs is not None:
        extrap = extrap / torch.tensor(rope.rope_freqs, dtype=torch.float64)
    theta = extrap * freq_scale
    if ext_factor:
        factor = 1.0 / freq_scale
        mscale *= (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0) / (1.0 + 0.1 * math.log(factor))
        n_ctx_orig = rope.original_context_length or rope.context_length

        def corr_dim(turns: float) -> float:
            return rotary_dim * math.log(n_ctx_orig / (turns * 2 * math.pi)) / (2 * math.log(rope.freq_base))

        low, high = max(0, math.floor(corr_dim(32.0))), min(rotary_dim - 1, math.ceil(corr_dim(1.0)))
        ramp = (1 - torch.clamp((pairs - low) / max(0.001, high - low), 0, 1)) * ext_factor
        theta = theta * (1 - ramp) + extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    return theta, mscale


def transformers_rope(config) -> tuple[torch.Tensor, float]:
    params = config.rope_parameters
    if params["rope_type"] == "default":
        return default_inv_freq(params["rope_theta"], rotary_dim_of(config)).double(), 1.0
    inv_freq, attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu", seq_len=4 * L_ORIG)
    return inv_freq.double(), float(attention)


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": L_ORIG // 2}
CASES = {
    "linear": ({}, "linear", {}),
    "ntk": ({}, "ntk", {}),
    "yarn": ({}, "yarn", {}),
    "yarn attention_factor": ({}, "yarn", {"attention_factor": 1.3}),
    "yarn other betas": ({}, "yarn", {"beta_fast": 16.0, "beta_slow": 2.0}),
    "llama3 shipped": ({"rope_parameters": LLAMA3}, None, {}),
    "yarn on llama3": ({"rope_parameters": LLAMA3}, "yarn", {}),
    "linear on llama3": ({"rope_parameters": LLAMA3}, "linear", {}),
    "yarn on yarn": ({"rope_parameters": YARN}, "yarn", {}),
    "linear on yarn": ({"rope_parameters": YARN}, "linear", {}),
    "ntk on yarn": ({"rope_parameters": YARN}, "ntk", {}),
}


def case_config(name: str):
    overrides, method, kwargs = CASES[name]
    config = tiny_config(max_positions=L_ORIG, **overrides)
    return hf_posext.patch_model(config, method, factor=4, **kwargs) if method else config


@pytest.mark.parametrize("name", list(CASES))
def test_llamacpp_runs_the_written_rope_as_transformers(name):
    config = case_config(name)
    rope = gguf_rope_for(config, "llama")
    theta, mscale = llamacpp_rope(rope, HEAD_DIM)
    inv_freq, attention = transformers_rope(config)
    torch.testing.assert_close(theta, inv_freq, rtol=2e-6, atol=0)
    assert mscale == pytest.approx(attention, rel=1e-6)
    # the reach, which llama.cpp's default context takes (a shipped llama3 reaches max_position_embeddings)
    assert rope.context_length == (4 * L_ORIG if CASES[name][1] else L_ORIG)


def test_what_each_static_rope_is_written_as():
    assert gguf_rope_for(case_config("ntk"), "llama").keys() == {
        "context_length": 256,
        "rope.freq_base": pytest.approx(ntk_theta(10000.0, 4.0, HEAD_DIM)),
        "rope.scaling.type": "none",
    }
    assert gguf_rope_for(case_config("linear"), "llama").keys() == {
        "context_length": 256,
        "rope.freq_base": 10000.0,
        "rope.scaling.type": "linear",
        "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": L_ORIG,
    }
    attn = gguf_rope_for(case_config("yarn attention_factor"), "qwen2")  # metadata only: any architecture
    assert (attn.scaling_type, attn.rope_freqs) == ("yarn", None)
    assert attn.attn_factor == pytest.approx(1.3 / (0.1 * math.log(4) + 1))
    for name in ("yarn other betas", "llama3 shipped", "yarn on llama3", "linear on yarn"):
        per_pair = gguf_rope_for(case_config(name), "llama")
        assert per_pair.scaling_type == "none" and len(per_pair.rope_freqs) == HEAD_DIM // 2, name


def test_a_gguf_rope_read_back_is_the_same_base():
    """rope_config_of inverts gguf_rope_for: the config it builds runs the same rope in transformers."""
    for name in CASES:
        config = case_config(name)
        rope = gguf_rope_for(config, "llama")
        back = rope_config_of(rope, "llama", 4, 2, 4 * HEAD_DIM, HEAD_DIM, HEAD_DIM)
        inv_freq, attention = transformers_rope(back)
        torch.testing.assert_close(inv_freq, transformers_rope(config)[0], rtol=2e-6, atol=0, msg=name)
        assert attention == pytest.approx(transformers_rope(config)[1], rel=1e-6), name
        assert gguf_rope_for(back, "llama").keys() == pytest.approx(rope.keys()), name


@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn", "alibi"])
def test_dynamic_and_attention_level_methods_are_refused_naming_what_llamacpp_runs(method):
    config = hf_posext.patch_model(
        tiny_config(max_positions=L_ORIG), method, **({} if method == "alibi" else {"factor": 4})
    )
    with pytest.raises(ValueError, match="use --method (ntk|yarn)"):
        gguf_rope_for(config, "llama")


def test_per_pair_scalings_are_refused_where_llamacpp_has_no_rope_freqs():
    with pytest.raises(ValueError, match="'qwen2' graph loads none"):
        gguf_rope_for(case_config("yarn other betas"), "qwen2")
    with pytest.raises(ValueError, match="GGUF architecture 'gemma3' is not supported"):
        gguf_rope_for(case_config("yarn"), "gemma3")


def test_the_sliding_windows_llamacpp_drops_are_named():
    from hf_posext.gguf.export import dropped_sliding_window

    assert dropped_sliding_window(tiny_config("mistral", sliding_window=128)) == 128
    assert dropped_sliding_window(tiny_config("mistral", sliding_window=None)) is None
    assert dropped_sliding_window(tiny_config("qwen2", sliding_window=128)) is None  # use_sliding_window=False
    assert dropped_sliding_window(tiny_config("qwen2", sliding_window=128, use_sliding_window=True)) == 128
    assert dropped_sliding_window(tiny_config("llama")) is None
