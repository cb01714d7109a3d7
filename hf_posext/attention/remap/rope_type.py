"""The remapping's rope type: the checkpoint's own rope entry kept under `hf_posext.rope_utils.REMAP_ROPE_TYPE`.

The training-free methods keep the checkpoint's rotary embedding as it is (plain, raised theta, or a
shipped static scaling: llama3, yarn, longrope); a patched config names the remapping's rope type and
keeps the shipped one as ``remapped_rope_type``, so that transformers computes the same frequencies.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ... import integration
from ...rope_utils import REMAP_ROPE_TYPE, REMAPPED_TYPE_KEY, default_inv_freq, rope_parameters_for, rotary_dim_of


def remap_rope_parameters(shipped: dict[str, Any]) -> dict[str, Any]:
    """``shipped`` under the remapping's rope type, its own type kept as ``remapped_rope_type``."""
    return {**shipped, "rope_type": REMAP_ROPE_TYPE, REMAPPED_TYPE_KEY: shipped.get("rope_type", "default")}


def shipped_parameters(rope_parameters: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's own entry back from a `remap_rope_parameters` one."""
    params = dict(rope_parameters)
    params["rope_type"] = params.pop(REMAPPED_TYPE_KEY, "default")
    return params


def _shipped_config(config: Any, layer_type: str | None) -> Any:
    probe = copy.copy(config)
    probe.__dict__["rope_parameters"] = shipped_parameters(rope_parameters_for(config, layer_type))
    return probe


def compute_remap_rope_parameters(
    config: Any, device: torch.device | str | None = None, seq_len: int | None = None, layer_type: str | None = None
) -> tuple[torch.Tensor, float]:
    """transformers' rope-init contract for `hf_posext.rope_utils.REMAP_ROPE_TYPE`: the shipped type's own.

    Plain RoPE as transformers' ``compute_default_rope_parameters`` computes it (bit for bit);
    any other type by its own transformers function.
    """
    probe = _shipped_config(config, layer_type)
    params = probe.rope_parameters
    if params["rope_type"] == "default":
        return default_inv_freq(float(params["rope_theta"]), rotary_dim_of(probe, params), device), 1.0
    return integration.rope_init_function(params["rope_type"])(probe, device, seq_len, layer_type)


def validate_remap_rope_parameters(
    config: Any, rope_parameters: dict[str, Any], ignore_keys: set[str] | None = None
) -> None:
    """Validate the shipped entry by its own type's validator (``remapped_rope_type`` is the one extra key).

    Raises:
        KeyError: no ``remapped_rope_type`` (transformers' rule for a missing required key).
    """
    if REMAPPED_TYPE_KEY not in rope_parameters:
        raise KeyError(
            f"Missing required keys in `rope_parameters` for 'rope_type'='{REMAP_ROPE_TYPE}': {{'{REMAPPED_TYPE_KEY}'}}"
        )
    params = shipped_parameters(rope_parameters)
    shipped = params["rope_type"]
    if not isinstance(shipped, str) or shipped == REMAP_ROPE_TYPE or not integration.is_registered_rope_type(shipped):
        raise ValueError(
            f"rope_parameters[{REMAPPED_TYPE_KEY!r}] must name the checkpoint's own rope type (default, "
            f"linear, yarn, llama3, longrope...), got {shipped!r}"
        )
    getattr(config, f"_validate_{shipped}_rope_parameters")(params, ignore_keys=ignore_keys)
