"""Position Interpolation (PI, "linear" scaling).

Chen et al. 2023, "Extending Context Window of Large Language Models via Positional
Interpolation", arXiv 2306.15595, eq. (3): f'(x, m) = f(x, m / s), i.e. every position index is
divided by the scale s, which is the same as dividing every rotary frequency by s. This is
transformers' native ``rope_type="linear"``; the patched config uses it as is.

The patched config keeps ``max_position_embeddings`` at the original context L0, as released
linear checkpoints do (lmsys/vicuna-13b-v1.5-16k: 4096 with factor 4): vLLM and SGLang derive the
context as ``max_position_embeddings x factor`` (hf_posext.readers.vllm, .sglang), and linear
scaling itself never reads it. transformers' ``generate`` caps its *default* length at it, so ask
for ``max_new_tokens`` explicitly (as for the dynamic methods).

On a checkpoint that ships a static scaling (composition, :class:`~hf_posext.methods.base.BaseRope`)
PI divides every one of the checkpoint's own frequencies by s and keeps its attention factor:
on a ``linear`` checkpoint that is native ``linear`` with the product of the two factors, on
any other a native ``longrope`` entry. On a ``linear`` checkpoint ``max_position_embeddings`` is
what the checkpoint reaches divided by its own factor, so that readers multiplying it by the
product factor derive what the checkpoint reached times s, whichever convention the checkpoint
followed; a ``longrope`` entry advertises s x L0, as yarn does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .base import BaseRope, PositionMethod, register


@register("linear", aliases=("pi",))
@dataclass(frozen=True)
class LinearConfig(PositionMethod):
    """Position Interpolation: every position divided by ``factor`` (native ``linear``)."""

    paper = "Chen et al. 2023, Position Interpolation, arXiv:2306.15595"
    composes = True

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return {**base.rope_parameters, "rope_type": "linear", "factor": self.factor}

    def max_position_embeddings(self, base: BaseRope) -> int:
        # Readers multiply a native linear entry's max_position_embeddings by its factor (see above).
        if base.pair_divisors is None:
            return base.original_max_position_embeddings
        if base.rope_type == "linear":
            return int(round(base.original_max_position_embeddings / float(base.rope_parameters["factor"])))
        return super().max_position_embeddings(base)

    def pair_factors(self, base: BaseRope) -> torch.Tensor:
        return torch.full((base.rotary_dim // 2,), self.factor, dtype=torch.float64)

    def composed_rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        if base.rope_type == "linear":
            return {**base.rope_parameters, "factor": float(base.rope_parameters["factor"]) * self.factor}
        return super().composed_rope_parameters(base)
