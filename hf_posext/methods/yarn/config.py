"""YaRN and dynamic YaRN: the NTK-by-parts frequency ramp plus an attention temperature.

Peng et al. 2023, arXiv 2309.00071. Static YaRN is native ``rope_type="yarn"``; dynamic YaRN has
its own rope type (`rope`). The maths, where the code departs from the paper, the bound on
s(L) and the composition rules: docs/methods/yarn.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...rope_utils import DYNAMIC_YARN_ROPE_TYPE, default_inv_freq, yarn_attention_factor, yarn_pair_factors
from ..base import BaseRope, MethodConfig, real_number
from ..dynamic import DynamicScaling


@dataclass(frozen=True)
class _YarnFields(MethodConfig):
    """YaRN's hyper-parameters (eqs. 18 and 22), shared by the static and dynamic methods.

    Args:
        beta_fast: pairs making more than this many turns over L_orig are not interpolated (32).
        beta_slow: pairs making fewer turns are fully interpolated (1).
        attention_factor: a fixed cos/sin multiplier replacing 0.1 ln(s) + 1.
    """

    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for field in ("beta_fast", "beta_slow"):
            given = getattr(self, field)
            value = real_number(self.name, field, given, "> 0")
            if value <= 0:
                raise ValueError(f"{self.name}: {field} must be a positive number, got {given!r}")
            object.__setattr__(self, field, value)
        if self.beta_fast <= self.beta_slow:
            raise ValueError(
                f"{self.name}: beta_fast must be greater than beta_slow, got beta_fast={self.beta_fast!r} "
                f"and beta_slow={self.beta_slow!r}"
            )
        if self.attention_factor is not None:
            value = real_number(self.name, "attention_factor", self.attention_factor, "> 0 or None")
            if value <= 0:
                raise ValueError(
                    f"{self.name}: attention_factor must be a positive number or None, got {self.attention_factor!r}"
                )
            object.__setattr__(self, "attention_factor", value)

    def _yarn_parameters(self, base: BaseRope, rope_type: str) -> dict[str, Any]:
        params = {
            **base.rope_parameters,
            "rope_type": rope_type,
            "factor": self.factor,
            "original_max_position_embeddings": base.original_max_position_embeddings,
            "beta_fast": float(self.beta_fast),
            "beta_slow": float(self.beta_slow),
        }
        if self.attention_factor is not None:
            params["attention_factor"] = float(self.attention_factor)
        return params


@dataclass(frozen=True)
class YarnConfig(_YarnFields):
    """YaRN: NTK-by-parts frequency ramp plus 0.1 ln(s) + 1 attention temperature (native ``yarn``)."""

    paper = "Peng et al. 2023, YaRN, arXiv:2309.00071"
    composes = True

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return self._yarn_parameters(base, "yarn")

    def pair_factors(self, base: BaseRope) -> torch.Tensor | None:
        if base.pair_divisors is None:
            return None
        base_inv_freq = default_inv_freq(base.theta, base.rotary_dim).double() / base.pair_divisors
        return yarn_pair_factors(
            base_inv_freq, base.original_max_position_embeddings, self.factor, self.beta_fast, self.beta_slow
        )

    def temperature(self, base: BaseRope) -> float:
        return yarn_attention_factor(self.attention_factor, self.factor)


@dataclass(frozen=True)
class DynamicYarnConfig(_YarnFields, DynamicScaling):
    """Dynamic YaRN: YaRN with s = min(factor, max(1, L / L_orig)) from the current length."""

    paper = "Peng et al. 2023, YaRN, arXiv:2309.00071 sec. 3.3"
    composes = True
    #: transformers' dynamic update stores YaRN's attention scaling on the rotary module, not per layer type.
    per_layer_type_rope = False
    static_equivalent = "yarn"

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return self._yarn_parameters(base, DYNAMIC_YARN_ROPE_TYPE)

    def composed_rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        params = {k: v for k, v in self._yarn_parameters(base, DYNAMIC_YARN_ROPE_TYPE).items() if k in _DYNAMIC_KEYS}
        params["base_factors"] = [float(c) for c in base.pair_divisors]
        params["base_attention_factor"] = float(base.attention_factor)
        return params


#: What a composed dynamic YaRN entry keeps of the checkpoint's own entry: its scaling is in base_factors.
_DYNAMIC_KEYS = {
    "rope_type",
    "rope_theta",
    "partial_rotary_factor",
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "attention_factor",
}
