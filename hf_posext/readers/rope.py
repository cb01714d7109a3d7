"""One description of "the rope a reader runs", so that readers can be compared with transformers 5.

`intended_rope` says what transformers 5 runs for a ``rope_parameters`` dict; each reader
module has an ``effective_rope`` that says what that reader runs for the same saved config,
re-written from its source. Two descriptions are equal exactly when the reader rotates queries
and keys as transformers 5 does (for the positions it accepts). `same_rope` compares two ``rope_parameters``
dicts by the frequencies transformers' own functions compute; `in_words` says one in a few words.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from .. import integration
from ..rope_utils import default_inv_freq, rotary_dim_of

RopeDescription = dict[str, Any]


def describe(kind: str, theta: float, **params: Any) -> RopeDescription:
    """``{"kind": ..., "theta": ..., **params}`` with ``None`` parameters dropped and numbers as floats."""
    out: RopeDescription = {"kind": kind, "theta": float(theta)}
    out.update({k: float(v) for k, v in params.items() if v is not None})
    return out


def intended_rope(rope_parameters: dict[str, Any]) -> RopeDescription:
    """What transformers 5 runs for a flat ``rope_parameters`` dict (hf-posext's types by their name)."""
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
    theta = rope_parameters["rope_theta"]
    if rope_type == "default":
        return describe("default", theta)
    if rope_type in ("linear", "dynamic"):
        return describe(rope_type, theta, factor=rope_parameters["factor"])
    if rope_type == "yarn":
        return _yarn(theta, rope_parameters, attention_factor=rope_parameters.get("attention_factor"))
    return {"kind": rope_type, "theta": float(theta)}


def _yarn(theta: float, rope: dict[str, Any], **params: Any) -> RopeDescription:
    return describe(
        "yarn",
        theta,
        factor=rope["factor"],
        original=rope["original_max_position_embeddings"],
        beta_fast=rope.get("beta_fast", 32),
        beta_slow=rope.get("beta_slow", 1),
        **params,
    )


def engine_rope(rope_type: str, theta: float, rope: dict[str, Any]) -> RopeDescription:
    """What vLLM's and SGLang's ``get_rope`` build for the types they build alike (all but ``dynamic``).

    SGLang's rotary embeddings are adapted from vLLM's: the same classes for the same types.

    Raises:
        ValueError: for a rope type neither knows, as they do.
    """
    if rope_type == "default":
        return describe("default", theta)
    if rope_type == "linear":
        return describe("linear", theta, factor=rope["factor"])
    if rope_type == "yarn":
        return _yarn(theta, rope)
    if rope_type == "llama3":  # Llama3RotaryEmbedding: factor, low/high_freq_factor, original as written
        return {"kind": "llama3", "theta": float(theta)}
    if rope_type == "longrope":  # Phi3LongRoPEScaledRotaryEmbedding: the factors as written, short/long_mscale
        return describe("longrope", theta)
    raise ValueError(f"Unknown RoPE scaling type {rope_type}")


def in_words(params: dict[str, Any]) -> str:
    """``"yarn (factor 4, original 4096, theta 10000)"``: a rope in a few words."""
    rope_type = params.get("rope_type", "default")
    parts = [
        f"{k.replace('original_max_position_embeddings', 'original')} {params[k]:g}"
        for k in ("factor", "original_max_position_embeddings", "rope_theta")
        if isinstance(params.get(k), (int, float))
    ]
    return f"{'plain RoPE' if rope_type == 'default' else rope_type} ({', '.join(parts)})"


def _rope_at(config: Any, params: dict[str, Any], seq_len: int) -> tuple[torch.Tensor, float]:
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":  # transformers 5 computes plain RoPE in the rotary module, not in ROPE_INIT_FUNCTIONS
        return default_inv_freq(float(params["rope_theta"]), rotary_dim_of(config, params)).double(), 1.0
    probe = copy.deepcopy(config)
    probe.rope_parameters = dict(params)
    if "original_max_position_embeddings" in params and hasattr(probe, "original_max_position_embeddings"):
        # standardize_rope_params (run by the rope functions) prefers Phi-3's top-level field over the params'
        probe.original_max_position_embeddings = params["original_max_position_embeddings"]
    inv_freq, attention = integration.rope_init_function(rope_type)(probe, "cpu", seq_len=seq_len)
    return inv_freq.double(), float(attention)


def same_rope(config: Any, a: dict[str, Any], b: dict[str, Any], lengths: tuple[int, ...]) -> bool:
    """Whether transformers' rope functions give the same frequencies and attention factor for ``a`` and ``b``."""
    if a.get("rope_type", "default") != b.get("rope_type", "default"):
        return False
    for n in lengths:
        (fa, aa), (fb, ab) = _rope_at(config, a, n), _rope_at(config, b, n)
        if fa.shape != fb.shape or not torch.allclose(fa, fb, rtol=1e-9, atol=0) or abs(aa - ab) > 1e-9 * abs(ab):
            return False
    return True
