"""The base of the training-free methods that remap positions inside attention (Self-Extend, DCA, STRING, ReRoPE).

They keep the checkpoint's rotary embedding as it is (plain, raised theta, or a shipped static
scaling: llama3, yarn, longrope) and score some (query, key) pairs at other positions
(:mod:`hf_posext.attention.remap`). Their surgery selects the remapping attention wrapper.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .. import integration
from ..rope_utils import REMAP_ROPE_TYPE, REMAPPED_TYPE_KEY, default_inv_freq, rope_parameters_for, rotary_dim_of
from .base import BaseRope, MethodConfig
from .registry import RopeType


def remap_rope_parameters(shipped: dict[str, Any]) -> dict[str, Any]:
    """``shipped`` under the remapping's rope type, its own type kept as ``remapped_rope_type``."""
    return {**shipped, "rope_type": REMAP_ROPE_TYPE, REMAPPED_TYPE_KEY: shipped.get("rope_type", "default")}


def shipped_parameters(rope_parameters: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's own entry back from a :func:`remap_rope_parameters` one."""
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
    """transformers' rope-init contract for :data:`~hf_posext.rope_utils.REMAP_ROPE_TYPE`: the shipped type's own.

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


#: Registered by both families (the same functions, so the second registration is a no-op).
REMAP_ROPE_TYPES = {REMAP_ROPE_TYPE: RopeType(compute_remap_rope_parameters, validate_remap_rope_parameters)}


@dataclass(frozen=True)
class AttentionRemapMethod(MethodConfig):
    """Shared by methods that leave RoPE's frequencies alone and remap positions in attention."""

    scales_rope: ClassVar[bool] = False
    #: They run on top of whatever static scaling the checkpoint ships: its frequencies stay.
    composes: ClassVar[bool] = True

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        """The checkpoint's rope under :data:`~hf_posext.rope_utils.REMAP_ROPE_TYPE` (same frequencies)."""
        return remap_rope_parameters(base.rope_parameters)

    def composed_rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return remap_rope_parameters(base.rope_parameters)

    def max_position_embeddings(self, base: BaseRope) -> int:
        return self.reach(base.original_max_position_embeddings)

    def reach(self, original: int) -> int:
        """The context the patched model advertises, for the checkpoint's context ``original`` (L0)."""
        raise NotImplementedError

    def config_fields(self, original: int) -> dict[str, Any]:
        """Config keys beyond rope parameters that a patched config carries (what engines read)."""
        return {}

    def remapping(self, original: int) -> Any:
        """The :class:`~hf_posext.attention.remap.Remapping` for L0 = ``original`` (validates against it)."""
        raise NotImplementedError
