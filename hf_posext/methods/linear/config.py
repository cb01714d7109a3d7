"""Position Interpolation (PI, "linear"): every position divided by the scale (native ``rope_type="linear"``).

Chen et al. 2023, arXiv 2306.15595; the maths and the composition rule: docs/methods/linear.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..base import BaseRope, MethodConfig


@dataclass(frozen=True)
class LinearConfig(MethodConfig):
    """Position Interpolation: every position divided by ``factor`` (native ``linear``)."""

    paper = "Chen et al. 2023, Position Interpolation, arXiv:2306.15595"
    composes = True

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return {**base.rope_parameters, "rope_type": "linear", "factor": self.factor}

    def max_position_embeddings(self, base: BaseRope) -> int:
        # Readers multiply a native linear entry's max_position_embeddings by its factor (docs/methods/linear.md).
        if base.pair_divisors is None:
            return base.original_max_position_embeddings
        if base.rope_type == "linear":
            return int(round(base.original_max_position_embeddings / float(base.rope_parameters["factor"])))
        return super().max_position_embeddings(base)

    def pair_factors(self, base: BaseRope) -> torch.Tensor:
        return torch.full((base.rotary_dim // 2,), self.factor, dtype=torch.float64)

    def composed_rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        if base.rope_type in ("linear", "proportional"):  # both divide every frequency by their own factor
            return {**base.rope_parameters, "factor": float(base.rope_parameters.get("factor", 1.0)) * self.factor}
        return super().composed_rope_parameters(base)
