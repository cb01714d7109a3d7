"""ALiBi: attention with linear biases instead of rotary embeddings.

Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation", arXiv:2108.12409, eq. 1: softmax(q_i K^T / sqrt(d) + m * [-(i-1), ..., -1, 0]),
one slope m_h per head (:mod:`hf_posext.attention.slopes`), no position embedding at all.

``patch_model(model, "alibi")`` does two things through transformers' own extension points:

1. the rope type :data:`~hf_posext.rope_utils.NO_ROPE_TYPE` (registered on ``import hf_posext``) gives every rotary
   module ``inv_freq = 0``, so cos = 1, sin = 0 and ``apply_rotary_pos_emb`` returns q and k
   unchanged, bit for bit;
2. its adapter (:mod:`hf_posext.adapters.alibi`) sets ``config._attn_implementation`` to :data:`~hf_posext.attention.alibi.ALIBI_ATTENTION`,
   whose attention and mask functions add -m_h (i - j). The name is also written to
   ``config.json`` (``attn_implementation``), which transformers applies when it loads the
   config, so a saved ALiBi checkpoint reloads as ALiBi after ``import hf_posext``; without the
   import, loading fails with ``attn_implementation="hf_posext_alibi (requires: import hf_posext)"
   is not supported``.

Example (CPU, seconds)::

    model = hf_posext.patch_model(LlamaForCausalLM(config), "alibi")   # backend="auto": SDPA on CPU
    hf_posext.patch_model(model, "alibi", backend="flex")               # long-context CPU inference
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..attention.alibi import BACKENDS, Backend
from ..rope_utils import NO_ROPE_TYPE
from .base import BaseRope, PositionMethod, register


@dataclass(frozen=True)
class NoRopeMethod(PositionMethod):
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


@register("alibi")
@dataclass(frozen=True)
class AlibiConfig(NoRopeMethod):
    """ALiBi (Press et al. 2022): rotary off, -m_h (i - j) added to each head's logits.

    Args:
        backend: the attention path: "auto" (flash-attn on CUDA in fp16/bf16 when installed,
            FlexAttention on other CUDA runs, SDPA on CPU), "eager", "sdpa", "flex" (no L x L
            bias in memory; forward only on CPU), "flash", or "folded" (the bias as extra channels of
            SDPA's causal kernel: no L x L bias, trains on CPU; masks it cannot express run "sdpa").
    """

    paper: ClassVar[str] = "Press et al. 2022, ALiBi, arXiv:2108.12409"

    backend: Backend = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in BACKENDS:
            raise ValueError(f"{self.name}: backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
