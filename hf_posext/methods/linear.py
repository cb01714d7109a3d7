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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import BaseRope, PositionMethod, register


@register("linear", aliases=("pi",))
@dataclass(frozen=True)
class LinearConfig(PositionMethod):
    """Position Interpolation: every position divided by ``factor`` (native ``linear``)."""

    paper = "Chen et al. 2023, Position Interpolation, arXiv:2306.15595"

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return {**base.rope_parameters, "rope_type": "linear", "factor": self.factor}

    def max_position_embeddings(self, base: BaseRope) -> int:
        return base.original_max_position_embeddings  # readers multiply it by the factor (see above)
