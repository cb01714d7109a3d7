"""All of hf-posext's RoPE maths, in one module that imports nothing of the package.

Like transformers' ``modeling_rope_utils.py``: the method families, the exact-dynamic attention and the
surgeries import from here, and this module imports none of them (only ``math`` and ``torch``).
The families' rope-init functions (registered with ``ROPE_INIT_FUNCTIONS`` on ``import hf_posext``)
are built from these.

Papers: NTK-aware (bloc97 2023; YaRN paper arXiv:2309.00071 eq. 16), YaRN (Peng et al. 2023,
arXiv:2309.00071, eqs. 17-22; the ramp as implemented: docs/methods/yarn.md), dynamic YaRN (same
paper, sec. 3.3).
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: The config attribute holding what a patch did (the method's name and arguments, what the
#: checkpoint had); saved in config.json with the checkpoint.
CONFIG_KEY = "hf_posext"

#: The ``rope_type`` dynamic YaRN registers; a vanilla transformers install that cannot load it
#: shows this name in its KeyError, so it says what is missing (hf_posext.readers.transformers5).
DYNAMIC_YARN_ROPE_TYPE = "hf_posext_dynamic_yarn (requires: import hf_posext)"

#: The rope type that switches rotary embeddings off (inv_freq = 0: cos = 1, sin = 0); used by
#: ALiBi and the absolute-position baselines. Named like DYNAMIC_YARN_ROPE_TYPE.
NO_ROPE_TYPE = "hf_posext_none (requires: import hf_posext)"

#: The rope type of a Self-Extend/DCA checkpoint: the checkpoint's own rope (named by
#: ``remapped_rope_type``) under a name vanilla transformers refuses even when the saved attention
#: name is replaced by an explicit ``attn_implementation``. Named like DYNAMIC_YARN_ROPE_TYPE.
REMAP_ROPE_TYPE = "hf_posext_remap (requires: import hf_posext)"
#: The key of a `REMAP_ROPE_TYPE` entry naming the checkpoint's own rope type.
REMAPPED_TYPE_KEY = "remapped_rope_type"

#: The rope type of LongRoPE with its first n positions kept on plain RoPE (the paper's n-hat):
#: transformers' ``longrope`` entry plus `KEEP_FIRST_KEY`, which no other reader implements, so
#: it goes under a name they refuse (named like DYNAMIC_YARN_ROPE_TYPE; docs/methods/longrope.md).
LONGROPE_KEEP_FIRST_ROPE_TYPE = "hf_posext_longrope_keep_first (requires: import hf_posext)"
#: The key of a `LONGROPE_KEEP_FIRST_ROPE_TYPE` entry: how many positions from 0 keep plain RoPE.
KEEP_FIRST_KEY = "keep_first"
#: The rope types with LongRoPE's short/long switch at ``original_max_position_embeddings``.
LONGROPE_ROPE_TYPES = ("longrope", LONGROPE_KEEP_FIRST_ROPE_TYPE)


def kept_positions(rope_parameters: dict[str, Any] | None) -> int:
    """How many positions from 0 a flat rope entry keeps on plain RoPE once past its switch (0: none).

    Only `LONGROPE_KEEP_FIRST_ROPE_TYPE` keeps any: past ``original_max_position_embeddings``
    positions ``p < keep_first`` rotate by ``p * theta^(-2i/d)`` with cos/sin multiplier 1, the
    others with the long factors and the attention factor.
    """
    params = rope_parameters or {}
    if params.get("rope_type") != LONGROPE_KEEP_FIRST_ROPE_TYPE:
        return 0
    return int(params.get(KEEP_FIRST_KEY) or 0)


#: The rope type of a method composed on p-RoPE (transformers' ``proportional``) where no native type
#: expresses it: p-RoPE's frequencies divided pair by pair by ``factors`` (one per pair of head_dim),
#: cos/sin times ``attention_factor`` (`proportional_inv_freq`). Named like DYNAMIC_YARN_ROPE_TYPE.
PROPORTIONAL_ROPE_TYPE = "hf_posext_proportional (requires: import hf_posext)"
#: transformers' p-RoPE type and hf-posext's composed one: frequencies over the whole head_dim.
P_ROPE_TYPES = ("proportional", PROPORTIONAL_ROPE_TYPE)


def layer_config(config: Any, layer_type: str | None = None) -> Any:
    """The config the modules of ``layer_type`` are built from.

    A heterogeneous config (transformers 5's ``per_layer_config``; Gemma 4's full-attention layers have
    their own ``head_dim``) raises on reading a per-layer field globally: read it from the layer type's
    own view, as Gemma 4's rotary embedding does. Any other config is its own.
    """
    if layer_type is None or not getattr(config, "is_heterogeneous", False):
        return config
    return config.per_layer_config[layer_type]


def per_layer_values(config: Any, key: str) -> list[Any]:
    """``key`` of ``config`` (``None`` when absent), or of each layer where it is per layer (Gemma 4's head_dim)."""
    if key in (getattr(config, "per_layer_attributes", None) or ()):
        return [getattr(layer, key, None) for layer in config.per_layer_config]
    return [getattr(config, key, None)]


def pair_count(config: Any, entry: dict[str, Any]) -> int | None:
    """How many rotary pairs ``entry``'s per-pair lists need (head_dim / 2 for p-RoPE); ``None`` for a config
    whose shapes are not positive whole numbers (their own check names them)."""

    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    head_dim = getattr(config, "head_dim", None)
    if not whole(head_dim):
        hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
        if not (whole(hidden) and whole(heads)):
            return None
        head_dim = hidden // heads
    if entry.get("rope_type") in P_ROPE_TYPES:
        return head_dim // 2
    partial = entry.get("partial_rotary_factor", 1.0)
    real = isinstance(partial, (int, float)) and not isinstance(partial, bool) and math.isfinite(partial)
    return int(head_dim * partial) // 2 if real and 0 < partial <= 1 else None


def head_dim_of(config: Any, layer_type: str | None = None) -> int:
    """The attention head width of ``layer_type``'s layers: ``head_dim``, else hidden_size / heads."""
    config = layer_config(config, layer_type)
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def proportional_angles(head_dim: int, partial_rotary_factor: float) -> int:
    """How many of p-RoPE's head_dim / 2 pairs rotate: ``int(partial_rotary_factor * head_dim // 2)``
    (transformers' ``_compute_proportional_rope_parameters``); the others have frequency 0."""
    return int(partial_rotary_factor * head_dim // 2)


def proportional_inv_freq(
    theta: float,
    head_dim: int,
    partial_rotary_factor: float,
    divisors: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """p-RoPE's frequencies, ``[head_dim // 2]`` (Barbero et al. 2024, "Round and Round We Go", arXiv:2410.06205).

    The first `proportional_angles` frequencies of full RoPE at ``head_dim``, theta^(-2i/head_dim),
    each divided by its ``divisors[i]`` (a method applied to the full-head frequencies), the rest exactly
    0: the lowest frequencies are removed, and a method never brings them back. fp32 as
    [`default_inv_freq`][hf_posext.default_inv_freq]; the division in float64, so composed factors round once.
    """
    angles = proportional_angles(head_dim, partial_rotary_factor)
    full = default_inv_freq(theta, head_dim, device)
    if divisors is not None:
        full = (full.double() / divisors.to(full.device, torch.float64)).float()
    return torch.cat((full[:angles], torch.zeros(head_dim // 2 - angles, dtype=torch.float32, device=full.device)))


def rope_parameters_for(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """``config.rope_parameters``, or its entry for ``layer_type`` when the config nests them by layer type."""
    params = config.rope_parameters
    return params[layer_type] if layer_type is not None and layer_type in params else params


def rotary_dim_of(config: Any, rope_parameters: dict[str, Any] | None = None, layer_type: str | None = None) -> int:
    """The number of rotated channels per head: head_dim times the partial rotary factor.

    p-RoPE (`P_ROPE_TYPES`) spans the whole head_dim, its unrotated pairs at frequency 0.

    Args:
        layer_type: whose head_dim, on a config with per-layer fields (`layer_config`).
    """
    params = rope_parameters if rope_parameters is not None else config.rope_parameters
    head_dim = head_dim_of(config, layer_type)
    if params.get("rope_type") in P_ROPE_TYPES:
        return head_dim
    return int(head_dim * params.get("partial_rotary_factor", 1.0))


def default_inv_freq(theta: float, rotary_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Plain RoPE frequencies theta^(-2i/d), ``[rotary_dim // 2]``, computed in fp32.

    fp32 whatever the model dtype: in bf16, positions beyond 256 already lose integer precision.
    """
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / rotary_dim
    return 1.0 / (theta**exponent)


def ntk_theta(theta: float, factor: float, rotary_dim: int) -> float:
    """The NTK-aware base ``theta * s^(d / (d - 2))`` (YaRN paper, eq. 16)."""
    return theta * factor ** (rotary_dim / (rotary_dim - 2))


def yarn_mscale(factor: float) -> float:
    """YaRN's attention temperature as a cos/sin multiplier, 0.1 ln(s) + 1 (eq. 22); 1 for s <= 1."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def yarn_attention_factor(explicit: Any, factor: float) -> float:
    """The cos/sin multiplier of YaRN at scale ``factor``: an explicit ``attention_factor`` as given,
    else `yarn_mscale`."""
    return float(explicit) if explicit is not None else yarn_mscale(factor)


def yarn_inv_freq(
    theta: float,
    rotary_dim: int,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """YaRN's blended frequencies, ``[rotary_dim // 2]``, fp32 (transformers' and the reference code's ramp).

    The ramp is linear in the pair index i between the pairs where r_i = beta_fast and
    r_i = beta_slow (r_i = L_orig / (2 pi theta^(2i/d)) turns, so r_i = beta at
    i = d ln(L_orig / (2 pi beta)) / (2 ln theta)), floored / ceiled to whole pairs when ``truncate``.
    """

    def pair_where_turns_equal(turns: float) -> float:
        return rotary_dim * math.log(original_max_position_embeddings / (2 * math.pi * turns)) / (2 * math.log(theta))

    low, high = pair_where_turns_equal(beta_fast), pair_where_turns_equal(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # a one-pair ramp would divide by zero; the reference code nudges it too
    # extrapolate = gamma_i: 1 for fast pairs (r_i > beta_fast, kept), 0 for slow ones (interpolated)
    extrapolate = 1 - torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolate = extrapolate.to(device)
    inv_freq = default_inv_freq(theta, rotary_dim, device)
    return (inv_freq / factor) * (1 - extrapolate) + inv_freq * extrapolate


def yarn_inv_freq_from(
    params: dict, theta: float, rotary_dim: int, factor: Any, original: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """`yarn_inv_freq` with the ramp options (``beta_fast``, ``beta_slow``, ``truncate``) read
    from a rope-parameters dict, at transformers' defaults when absent."""
    return yarn_inv_freq(
        theta,
        rotary_dim,
        factor,
        original,
        beta_fast=params.get("beta_fast", 32.0),
        beta_slow=params.get("beta_slow", 1.0),
        truncate=params.get("truncate", True),
        device=device,
    )


def dynamic_yarn_scale(
    seq_len: int | torch.Tensor | None, factor: float, original_max_position_embeddings: int
) -> float:
    """s(L) = min(factor, max(1, L / L_orig)); 1 before any sequence is seen."""
    if seq_len is None:
        return 1.0
    return min(float(factor), max(1.0, int(seq_len) / original_max_position_embeddings))


# --- Composition on a checkpoint that already ships a static scaling -------------------------------
#
# A static scaling is a per-pair divisor c_i of the plain frequencies theta^(-2i/d) plus an
# attention factor a (the cos/sin multiplier). A method applied on top multiplies each c_i by its
# own per-pair factor m_i and a by its own temperature; the rules for m_i are below and in
# docs/methods/.


def ntk_pair_factors(factor: float, rotary_dim: int) -> torch.Tensor:
    """NTK-aware scaling as per-pair divisors ``s^(2i / (d - 2))``, ``[rotary_dim // 2]`` float64.

    theta' = theta * s^(d/(d-2)) gives theta'^(-2i/d) = theta^(-2i/d) / s^(2i/(d-2)): raising the base
    divides pair i by this factor (1 for the fastest pair, s for the slowest), which is what NTK
    means on a base whose frequencies are not theta^(-2i/d).
    """
    pairs = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return float(factor) ** (2 * pairs / (rotary_dim - 2))


def pair_where_turns_cross(log_turns: list[float], turns: float) -> float:
    """The fractional pair index at which ln(r_i) crosses ln(``turns``).

    ln r_i is read as piecewise linear in i, extended beyond both ends along its first and last
    segments. On plain RoPE ln r_i is linear in i, so this is exactly YaRN's closed form
    d ln(L / (2 pi beta)) / (2 ln theta) (`yarn_inv_freq`).
    """
    target = math.log(turns)
    last = len(log_turns) - 2
    segment = next(
        (k for k in range(last + 1) if (log_turns[k] - target) * (log_turns[k + 1] - target) <= 0),
        0 if target > log_turns[0] else last,
    )
    y0, y1 = log_turns[segment], log_turns[segment + 1]
    return segment + (target - y0) / (y1 - y0) if y1 != y0 else float(segment)


def yarn_pair_factors(
    base_inv_freq: torch.Tensor,
    reach: int,
    factor: float,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> torch.Tensor:
    """YaRN on top of already-scaled frequencies as per-pair divisors, ``[pairs]`` float64.

    The ramp of `yarn_inv_freq` with the base's own turns r_i = reach * omega_i / (2 pi) over
    the context it reaches: pairs past ``beta_fast`` turns keep their frequency (divisor exactly
    1), pairs under ``beta_slow`` are divided by s, the ramp between is linear in the pair index
    between the crossings of `pair_where_turns_cross` (floored / ceiled when ``truncate``).
    """
    rotary_dim = 2 * base_inv_freq.numel()
    log_turns = [math.log(reach * float(w) / (2 * math.pi)) for w in base_inv_freq.double()]
    low, high = pair_where_turns_cross(log_turns, beta_fast), pair_where_turns_cross(log_turns, beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    pairs = torch.arange(rotary_dim // 2, dtype=torch.float64)
    extrapolate = 1 - torch.clamp((pairs - low) / (high - low), 0, 1)
    return 1 / ((1 - extrapolate) / factor + extrapolate)


def longrope_rope_parameters(
    theta: float,
    divisors: torch.Tensor,
    attention_factor: float,
    original_max_position_embeddings: int,
    max_position_embeddings: int,
) -> dict[str, Any]:
    """A static per-pair scaling as transformers' native ``longrope`` entry.

    transformers computes longrope frequencies as 1 / (factor_i * theta^(2i/d)), taking
    ``long_factor`` past ``original_max_position_embeddings`` and ``short_factor`` before it:
    equal lists make the switch a no-op, and an explicit ``attention_factor`` replaces its
    sqrt(1 + ln s / ln L) default. vLLM's longrope ignores ``attention_factor`` and reads
    ``short_mscale`` / ``long_mscale`` (else the same default), so both are written too;
    transformers without the plugin loads them with an "Unrecognized keys" warning and no other effect
    (after ``import hf_posext``, none: `hf_posext.integration.accept_longrope_reader_keys`).
    """
    factors = [float(c) for c in divisors]
    return {
        "short_mscale": float(attention_factor),
        "long_mscale": float(attention_factor),
        "rope_type": "longrope",
        "rope_theta": float(theta),
        "short_factor": factors,
        "long_factor": list(factors),
        "factor": max_position_embeddings / original_max_position_embeddings,
        "original_max_position_embeddings": int(original_max_position_embeddings),
        "attention_factor": float(attention_factor),
    }


#: What a `PROPORTIONAL_ROPE_TYPE` entry may carry besides ``factors``: p-RoPE's own fields and the method's.
PROPORTIONAL_KEYS = {"attention_factor", "factor", "original_max_position_embeddings", "partial_rotary_factor"}


def proportional_rope_parameters(
    shipped: dict[str, Any],
    divisors: torch.Tensor,
    attention_factor: float,
    factor: float,
    original_max_position_embeddings: int,
) -> dict[str, Any]:
    """A method composed on a p-RoPE entry ``shipped``, as a `PROPORTIONAL_ROPE_TYPE` entry.

    Args:
        divisors: per-pair divisors of full RoPE's frequencies at head_dim, ``[head_dim // 2]`` (p-RoPE's
            own ``factor`` included).
        attention_factor: the cos/sin multiplier.
        factor, original_max_position_embeddings: the method's scale and the context it extends (recorded).
    """
    return {
        "rope_type": PROPORTIONAL_ROPE_TYPE,
        "rope_theta": float(shipped["rope_theta"]),
        "partial_rotary_factor": float(shipped.get("partial_rotary_factor", 1.0)),
        "factors": [float(c) for c in divisors],
        "attention_factor": float(attention_factor),
        "factor": float(factor),
        "original_max_position_embeddings": int(original_max_position_embeddings),
    }
