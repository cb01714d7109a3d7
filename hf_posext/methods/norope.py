"""What the methods that replace RoPE (ALiBi, the absolute encodings) share: rotary embeddings switched off.

The rope type `hf_posext.rope_utils.NO_ROPE_TYPE` gives every rotary module ``inv_freq = 0``,
so cos = 1, sin = 0 and ``apply_rotary_pos_emb`` returns q and k unchanged, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .. import integration
from ..rope_utils import NO_ROPE_TYPE, rope_parameters_for, rotary_dim_of
from .base import CONFIG_KEY, BaseRope, MethodConfig
from .registry import RopeType


@dataclass(frozen=True)
class NoRopeMethod(MethodConfig):
    """Shared by methods that replace RoPE rather than rescale it: ``factor`` has no meaning."""

    scales_rope: ClassVar[bool] = False
    takes_factor: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.factor != 1:
            raise ValueError(
                f"{self.name}: factor must be 1 (the method has no RoPE to scale; it reaches longer contexts "
                f"without one), got {self.factor!r}"
            )

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return {**base.rope_parameters, "rope_type": NO_ROPE_TYPE}

    def max_position_embeddings(self, base: BaseRope) -> int:
        return base.max_position_embeddings


def compute_no_rope_parameters(
    config: Any,
    device: torch.device | str | None = None,
    seq_len: int | None = None,
    layer_type: str | None = None,
) -> tuple[torch.Tensor, float]:
    """transformers' rope-init contract for "no rotary embedding" (`hf_posext.rope_utils.NO_ROPE_TYPE`).

    Returns:
        ``(zeros [rotary_dim // 2] fp32, 1.0)``: every angle is 0, so the rotation is the identity.
    """
    rotary_dim = rotary_dim_of(config, rope_parameters_for(config, layer_type))
    return torch.zeros(rotary_dim // 2, dtype=torch.float32, device=device), 1.0


def validate_no_rope_parameters(
    config: Any, rope_parameters: dict[str, Any], ignore_keys: set[str] | None = None
) -> None:
    """No rotary embedding: only ever written by a method that replaces RoPE, which its config's record names.

    Its own parameters are ``rope_theta`` (kept for unpatch); what it needs is that record
    (``config.hf_posext``): an entry of this type without it is missing the method that gives the
    model its positions, and is refused like any entry missing a required key.

    Raises:
        KeyError: no ``hf_posext`` record naming the method (an unknown key is warned about).
    """
    integration.check_received_keys(config, rope_parameters, {"rope_type"}, {"rope_theta"}, ignore_keys)
    record = getattr(config, CONFIG_KEY, None)
    if not isinstance(record, dict) or not record.get("method"):
        raise KeyError(
            f"rope_type {rope_parameters.get('rope_type')!r} switches rotary embeddings off for a method that replaces "
            f"them, and needs the config's {CONFIG_KEY!r} record naming that method "
            "(written by hf_posext.patch_model); "
            "this config has none"
        )


#: The rope types of every family that switches RoPE off (its name before 0.1's rename included).
NO_ROPE_TYPES = {
    NO_ROPE_TYPE: RopeType(compute_no_rope_parameters, validate_no_rope_parameters, old_names=("hf_posext_none",))
}
