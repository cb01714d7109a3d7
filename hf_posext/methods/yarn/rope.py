"""Dynamic YaRN's rope type: YaRN with s(L) = min(factor, max(1, L / L_orig)) from the current length.

Registered with transformers as `hf_posext.rope_utils.DYNAMIC_YARN_ROPE_TYPE` by the family
(`hf_posext.methods.yarn`); the shared frequency maths is in `hf_posext.rope_utils`.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import integration
from ...rope_utils import (
    default_inv_freq,
    dynamic_yarn_scale,
    rope_parameters_for,
    rotary_dim_of,
    yarn_attention_factor,
    yarn_inv_freq_from,
    yarn_pair_factors,
)
from .config import DynamicYarnConfig

_VALIDATED_KEYS = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"}
#: What a dynamic YaRN entry must have and may have (a composed one carries the checkpoint's own scaling).
_REQUIRED_KEYS = {"rope_type", "factor", "original_max_position_embeddings"}
_OPTIONAL_KEYS = {
    "rope_theta",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "truncate",
    "base_factors",
    "base_attention_factor",
}


def compute_dynamic_yarn_parameters(
    config: Any,
    device: torch.device | str | None = None,
    seq_len: int | torch.Tensor | None = None,
    layer_type: str | None = None,
) -> tuple[torch.Tensor, float]:
    """transformers' rope-init contract for dynamic YaRN.

    Args:
        config: a model config whose ``rope_parameters`` has ``rope_type`` =
            `hf_posext.rope_utils.DYNAMIC_YARN_ROPE_TYPE`, ``factor`` and ``original_max_position_embeddings``.
        device: where to build ``inv_freq``.
        seq_len: the current sequence length L; ``None`` at construction (s = 1).
        layer_type: the key of per-layer-type rope parameters, when the config nests them.

    Returns:
        ``(inv_freq [rotary_dim // 2], attention_factor)``; at s = 1 exactly plain RoPE.
    """
    params = rope_parameters_for(config, layer_type)
    theta = float(params["rope_theta"])
    rotary_dim = rotary_dim_of(config, params)
    original = int(params["original_max_position_embeddings"])
    scale = dynamic_yarn_scale(seq_len, params["factor"], original)
    if "base_factors" in params:
        return _composed_dynamic_yarn(params, theta, rotary_dim, original, scale, device)
    if scale == 1.0:
        return default_inv_freq(theta, rotary_dim, device), 1.0
    inv_freq = yarn_inv_freq_from(params, theta, rotary_dim, scale, original, device)
    return inv_freq, yarn_attention_factor(params.get("attention_factor"), scale)


def _composed_dynamic_yarn(
    params: dict[str, Any], theta: float, rotary_dim: int, reach: int, scale: float, device: torch.device | str | None
) -> tuple[torch.Tensor, float]:
    """Dynamic YaRN on a checkpoint's own static scaling (``base_factors`` c_i, ``base_attention_factor``).

    Up to ``reach`` (s = 1) the checkpoint's own frequencies and attention factor; past it, static
    YaRN at s(L) on top of them (`hf_posext.rope_utils.yarn_pair_factors`).
    """
    divisors = torch.tensor(params["base_factors"], dtype=torch.float64)
    base_inv_freq = default_inv_freq(theta, rotary_dim).double() / divisors
    attention = float(params.get("base_attention_factor", 1.0))
    if scale == 1.0:
        return base_inv_freq.float().to(device), attention
    factors = yarn_pair_factors(
        base_inv_freq,
        reach,
        scale,
        params.get("beta_fast", 32.0),
        params.get("beta_slow", 1.0),
        params.get("truncate", True),
    )
    return (base_inv_freq / factors).float().to(device), attention * yarn_attention_factor(
        params.get("attention_factor"), scale
    )


def validate_dynamic_yarn_parameters(
    config: Any, rope_parameters: dict[str, Any], ignore_keys: set[str] | None = None
) -> None:
    """transformers' validator for dynamic YaRN's rope parameters: the keys it needs, and its config's checks.

    Raises:
        KeyError: without ``factor`` or ``original_max_position_embeddings`` (an unknown key is warned about).
        ValueError: a value [`DynamicYarnConfig`][hf_posext.DynamicYarnConfig] refuses.
    """
    integration.check_received_keys(config, rope_parameters, _REQUIRED_KEYS, _OPTIONAL_KEYS, ignore_keys)
    DynamicYarnConfig(**{k: v for k, v in rope_parameters.items() if k in _VALIDATED_KEYS})
