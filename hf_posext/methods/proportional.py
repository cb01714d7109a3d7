"""Methods on p-RoPE (transformers 5's ``rope_type="proportional"``: Gemma 4, LFM3 full-attention layers).

p-RoPE (Barbero et al. 2024, "Round and Round We Go", arXiv:2410.06205) rotates only the
first ``int(partial_rotary_factor * head_dim // 2)`` pairs, at full RoPE's frequencies over the whole
head_dim (theta^(-2i/head_dim)); the lowest frequencies are 0. A method on p-RoPE is the method applied
to full RoPE at head_dim, the rotating pairs keep their scaled frequency and the zero ones stay zero
(docs/methods/composition.md). Written natively where transformers' ``proportional`` says it exactly
(PI: its own ``factor``; NTK: a raised ``rope_theta``), else as `hf_posext.rope_utils.PROPORTIONAL_ROPE_TYPE`
with the per-pair divisors, registered by the families whose methods write it.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import integration
from ..rope_utils import (
    PROPORTIONAL_ROPE_TYPE,
    PROPORTIONAL_KEYS,
    head_dim_of,
    layer_config,
    proportional_inv_freq,
    rope_parameters_for,
)
from .registry import RopeType


def compute_proportional_parameters(
    config: Any,
    device: torch.device | str | None = None,
    seq_len: int | None = None,
    layer_type: str | None = None,
) -> tuple[torch.Tensor, float]:
    """transformers' rope-init contract for `hf_posext.rope_utils.PROPORTIONAL_ROPE_TYPE`.

    Returns:
        ``(inv_freq [head_dim // 2], attention_factor)``: `hf_posext.rope_utils.proportional_inv_freq`
        with the entry's ``factors``.
    """
    params = rope_parameters_for(config, layer_type)
    head_dim = head_dim_of(layer_config(config, layer_type))
    factors = torch.tensor(params["factors"], dtype=torch.float64)
    if factors.numel() != head_dim // 2:
        raise ValueError(
            f"rope_parameters['factors'] has {factors.numel()} entries; p-RoPE at head_dim={head_dim} has "
            f"{head_dim // 2} pairs, one divisor each"
        )
    inv_freq = proportional_inv_freq(
        float(params["rope_theta"]), head_dim, float(params.get("partial_rotary_factor", 1.0)), factors, device
    )
    return inv_freq, float(params.get("attention_factor", 1.0))


def validate_proportional_parameters(
    config: Any, rope_parameters: dict[str, Any], ignore_keys: set[str] | None = None
) -> None:
    """transformers' validator for a composed p-RoPE entry.

    Raises:
        KeyError: without ``rope_theta`` or ``factors`` (an unknown key is warned about).
        ValueError: a divisor that is not a positive number.
    """
    integration.check_received_keys(
        config, rope_parameters, {"rope_type", "rope_theta", "factors"}, PROPORTIONAL_KEYS, ignore_keys
    )
    factors = rope_parameters["factors"]
    if not isinstance(factors, list) or not all(
        isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 for c in factors
    ):
        raise ValueError(
            f"rope_parameters['factors'] must be a list of positive numbers (per-pair divisors), got {factors!r}"
        )


#: Registered by every family whose methods compose on p-RoPE through it (the same functions: one registration).
PROPORTIONAL_ROPE_TYPES = {
    PROPORTIONAL_ROPE_TYPE: RopeType(compute_proportional_parameters, validate_proportional_parameters)
}
