"""Position Interpolation (PI, "linear" scaling).

Chen et al. 2023, "Extending Context Window of Large Language Models via Positional
Interpolation", arXiv 2306.15595, eq. (3): f'(x, m) = f(x, m / s), i.e. every position index is
divided by the scale s, which is the same as dividing every rotary frequency by s. This is
transformers' native ``rope_type="linear"``; the patched config uses it as is.
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
