"""Which rope types change with length, and the frequencies of many lengths at once (bit for bit the init functions').

A prompt past L_orig needs one frequency set per row (every length between L_orig and
saturation). The rope-init functions compute one length per call, and each call spends most of
its ~0.1 ms reading the config; here the per-length scalars are computed in Python floats exactly
as those functions do, and the per-pair maths runs once on a ``[lengths, rotary_dim // 2]``
tensor with the same fp32 operations, so every entry rounds the same way (tested against the
init functions). Rope types or parameters not handled here return ``None`` and the caller falls
back to one call per length.
"""

from __future__ import annotations

from typing import Any

import torch

from ...rope_utils import (
    DYNAMIC_YARN_ROPE_TYPE,
    LONGROPE_ROPE_TYPES,
    default_inv_freq,
    dynamic_yarn_scale,
    kept_positions,
    ntk_theta,
    rotary_dim_of,
    yarn_attention_factor,
    yarn_inv_freq_from,
)

#: The rope types whose frequencies depend on the sequence length, handled here (``longrope`` and
#: its keep-first type: one switch from short to long factors past L_orig; see `length_dependent`).
EXACT_ROPE_TYPES = ("dynamic", DYNAMIC_YARN_ROPE_TYPE, *LONGROPE_ROPE_TYPES)


def length_dependent(rope_parameters: dict[str, Any] | None) -> bool:
    """Whether these (flat) rope parameters give frequencies that change with the sequence length.

    The dynamic types always do; ``longrope`` only when its short and long factors differ (a
    composition saved as ``longrope`` writes equal lists, and then nothing switches) or it keeps
    its first positions on plain RoPE past the switch.
    """
    params = rope_parameters or {}
    rope_type = params.get("rope_type")
    if rope_type in LONGROPE_ROPE_TYPES:
        if kept_positions(params):
            return True
        return [float(f) for f in params.get("short_factor") or ()] != [
            float(f) for f in params.get("long_factor") or ()
        ]
    return rope_type in EXACT_ROPE_TYPES


def frequency_rows(
    config: Any, rope_type: str, lengths: list[int], device: torch.device | str
) -> tuple[torch.Tensor, list[float]] | None:
    """``(inv_freq [len(lengths), rotary_dim // 2] fp32, cos/sin multipliers)`` for each of ``lengths``.

    Row k equals ``ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=lengths[k])`` bit for
    bit. ``None`` for what is not handled here (composition on a shipped scaling: ``base_factors``).
    """
    params = config.rope_parameters
    dim = rotary_dim_of(config, params)
    theta = params["rope_theta"]
    if rope_type == "dynamic":
        # transformers: theta * (s L / L0 - (s - 1))^(d / (d - 2)) in Python floats,
        # L >= L0 = max_position_embeddings
        original, factor = config.max_position_embeddings, params["factor"]
        bases = [ntk_theta(theta, factor * max(length, original) / original - (factor - 1), dim) for length in lengths]
        return _default_rows(bases, dim, device), [1.0] * len(lengths)
    if rope_type != DYNAMIC_YARN_ROPE_TYPE or "base_factors" in params:
        return None
    original = int(params["original_max_position_embeddings"])
    scales = [dynamic_yarn_scale(length, params["factor"], original) for length in lengths]
    inv_freq = default_inv_freq(float(theta), dim, device).expand(len(lengths), -1).clone()
    stretched = [k for k, scale in enumerate(scales) if scale != 1.0]
    if stretched:
        # yarn_inv_freq divides by its factor; given a [n, 1] fp32 column it does so row by row,
        # as each length's call does with its Python float (cast to fp32 by the division)
        column = torch.tensor([scales[k] for k in stretched], dtype=torch.float32, device=device)[:, None]
        inv_freq[stretched] = yarn_inv_freq_from(params, float(theta), dim, column, original, device)
    own = params.get("attention_factor")
    multipliers = [1.0 if scale == 1.0 else yarn_attention_factor(own, scale) for scale in scales]
    return inv_freq, multipliers


def _default_rows(bases: list[float], dim: int, device: torch.device | str) -> torch.Tensor:
    """``1 / base^(2i / d)`` for each base, ``[len(bases), dim // 2]``: the init functions raise a
    Python float to an fp32 tensor, which casts the float to fp32 first, as this column does."""
    column = torch.tensor(bases, dtype=torch.float32, device=device)[:, None]
    return default_inv_freq(column, dim, device)
