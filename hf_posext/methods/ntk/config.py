"""NTK-aware scaling, static (a raised rope base, native ``default``) and dynamic (native ``dynamic``).

bloc97 2023 and emozilla 2023, formalised in the YaRN paper (arXiv 2309.00071, sec. 3.1 and 3.3);
the maths and the composition rule: docs/methods/ntk.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...rope_utils import ntk_pair_factors, ntk_theta
from ..base import BaseRope, MethodConfig
from ..dynamic import DynamicScaling


@dataclass(frozen=True)
class NTKConfig(MethodConfig):
    """Static NTK-aware: rope base raised to theta * s^(d/(d-2)) (native ``default``)."""

    paper = "bloc97 2023; YaRN paper arXiv:2309.00071 sec. 3.1"
    composes = True

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return {**base.rope_parameters, "rope_theta": ntk_theta(base.theta, self.factor, base.rotary_dim)}

    def pair_factors(self, base: BaseRope) -> torch.Tensor:
        return ntk_pair_factors(self.factor, base.rotary_dim)

    def composed_rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        if base.rope_type == "proportional":
            # p-RoPE's rotating pairs are theta^(-2i/head_dim) / factor: a raised base divides them by
            # s^(2i/(head_dim-2)) as on full RoPE at head_dim, natively
            return {**base.rope_parameters, "rope_theta": ntk_theta(base.theta, self.factor, base.rotary_dim)}
        return super().composed_rope_parameters(base)


@dataclass(frozen=True)
class DynamicNTKConfig(DynamicScaling):
    """Dynamic NTK: NTK base recomputed from the current length (native ``dynamic``)."""

    paper = "emozilla 2023; YaRN paper arXiv:2309.00071 sec. 3.3"
    static_equivalent = "ntk"

    @classmethod
    def only_hf_posext_computes(cls, record: dict[str, Any]) -> str | None:
        if not record.get("exact_cache"):
            return None
        return (
            "transformers' own dynamic NTK: frequencies from the whole sequence's length, at every position once it "
            "passes L_orig; this checkpoint's exact cache computes them per position, which only hf-posext does"
        )

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return {**base.rope_parameters, "rope_type": "dynamic", "factor": self.factor}
