"""ALiBi: attention with linear biases instead of rotary embeddings.

Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation", arXiv:2108.12409, eq. 1: softmax(q_i K^T / sqrt(d) + m * [-(i-1), ..., -1, 0]),
one slope m_h per head (:mod:`hf_posext.attention.slopes`), no position embedding at all.

``patch_model(model, "alibi")`` does two things through transformers' own extension points:

1. the rope type :data:`NO_ROPE_TYPE` (registered on ``import hf_posext``) gives every rotary
   module ``inv_freq = 0``, so cos = 1, sin = 0 and ``apply_rotary_pos_emb`` returns q and k
   unchanged, bit for bit;
2. ``config._attn_implementation`` becomes :data:`~hf_posext.attention.alibi.ALIBI_ATTENTION`,
   whose attention and mask functions add -m_h (i - j). The name is also written to
   ``config.json`` (``attn_implementation``), which transformers applies when it loads the
   config, so a saved ALiBi checkpoint reloads as ALiBi after ``import hf_posext``; without the
   import, loading fails with ``attn_implementation="hf_posext_alibi" is not supported``.

Example (CPU, seconds)::

    model = hf_posext.patch_model(LlamaForCausalLM(config), "alibi")   # backend="auto": SDPA on CPU
    hf_posext.patch_model(model, "alibi", backend="flex")               # long-context CPU inference
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..attention.alibi import ALIBI_ATTENTION, BACKENDS, NATIVE_TO_BACKEND, Backend
from .base import BaseRope, PositionMethod, register
from .yarn import _rope_dict, rotary_dim_of

if TYPE_CHECKING:
    import torch.nn as nn
    from transformers import PreTrainedConfig

#: The rope type that switches rotary embeddings off (inv_freq = 0: cos = 1, sin = 0).
NO_ROPE_TYPE = "hf_posext_none"


def compute_no_rope_parameters(
    config: PreTrainedConfig,
    device: torch.device | str | None = None,
    seq_len: int | None = None,
    layer_type: str | None = None,
) -> tuple[torch.Tensor, float]:
    """transformers' rope-init contract for "no rotary embedding".

    Returns:
        ``(zeros [rotary_dim // 2] fp32, 1.0)``: every angle is 0, so the rotation is the identity.
    """
    rotary_dim = rotary_dim_of(config, _rope_dict(config, layer_type))
    return torch.zeros(rotary_dim // 2, dtype=torch.float32, device=device), 1.0


def validate_no_rope_parameters(rope_parameters: dict[str, Any]) -> None:
    """Nothing to validate: the type has no parameters of its own (``rope_theta`` is kept for unpatch)."""


@dataclass(frozen=True)
class NoRopeMethod(PositionMethod):
    """Shared by methods that replace RoPE rather than rescale it: ``factor`` has no meaning."""

    scales_rope: ClassVar[bool] = False

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


@register("alibi")
@dataclass(frozen=True)
class AlibiConfig(NoRopeMethod):
    """ALiBi (Press et al. 2022): rotary off, -m_h (i - j) added to each head's logits.

    Args:
        backend: the attention path: "auto" (flash-attn on CUDA in fp16/bf16 when installed,
            FlexAttention on other CUDA runs, SDPA on CPU), "eager", "sdpa", "flex" (no L x L
            bias in memory; forward only on CPU) or "flash".
    """

    paper: ClassVar[str] = "Press et al. 2022, ALiBi, arXiv:2108.12409"

    backend: Backend = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in BACKENDS:
            raise ValueError(f"{self.name}: backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")

    def patch_config(self, config: PreTrainedConfig) -> None:
        record = config.hf_posext
        previous = config._attn_implementation
        if previous != ALIBI_ATTENTION:
            record["base_attn_implementation"] = previous
        config._attn_implementation = ALIBI_ATTENTION
        # transformers never saves _attn_implementation, but applies an ``attn_implementation``
        # key found in config.json when it loads the config.
        config.attn_implementation = ALIBI_ATTENTION

    def unpatch_config(self, config: PreTrainedConfig, record: dict[str, Any]) -> None:
        config._attn_implementation = record.get("base_attn_implementation")
        config.__dict__.pop("attn_implementation", None)

    def on_model_init(self, base_model: nn.Module) -> None:
        """A model is being built from an ALiBi config (``from_pretrained``): keep it ALiBi.

        Loading with ``attn_implementation="sdpa"`` (or eager, flex_attention, flash_attention_2)
        picks that ALiBi path instead of running without any position information.
        """
        config = base_model.config
        config.attn_implementation = ALIBI_ATTENTION
        requested = config._attn_implementation
        if requested != ALIBI_ATTENTION:
            if requested in NATIVE_TO_BACKEND:
                config.hf_posext["backend"] = NATIVE_TO_BACKEND[requested]
            config._attn_implementation = ALIBI_ATTENTION
