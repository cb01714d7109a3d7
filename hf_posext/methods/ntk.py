"""NTK-aware scaling, static and dynamic.

NTK-aware (bloc97, 2023; formalised in the YaRN paper, arXiv 2309.00071, section 3.1, eq. 16):
instead of dividing positions, raise the rotary base so that the lowest frequency is
interpolated by s while the highest is nearly untouched:

    theta' = theta * s^(d / (d - 2))          d = rotary dimension

With that base the model is just a default-RoPE model, so the static method writes a native
``rope_type="default"`` config with the raised ``rope_theta``: every runtime loads it.

On a checkpoint that ships a static scaling (composition) there is no base to raise: NTK is
defined by what raising it does to each pair, a divisor s^(2i/(d-2)) (1 for the fastest pair, s
for the slowest; :func:`~hf_posext.rope_utils.ntk_pair_factors`), applied to the checkpoint's
own frequencies; its attention factor is kept. A checkpoint with only a raised ``rope_theta`` is
plain RoPE: NTK raises that theta further.

Dynamic NTK (emozilla, 2023; YaRN paper section 3.3) recomputes the base from the current
length L once L > L_orig:

    theta'(L) = theta * (s * L / L_orig - (s - 1))^(d / (d - 2))

which is transformers' native ``rope_type="dynamic"``. transformers reads L_orig from
``config.max_position_embeddings``, so the patched config keeps that at L_orig. With
``exact_cache=True`` (the default) :mod:`hf_posext.exact_dynamic` keeps cached generation equal to
a forward pass; ``False`` keeps transformers' stale-key behaviour (issue 25104).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..rope_utils import ntk_pair_factors, ntk_theta
from .base import BaseRope, PositionMethod, register
from .dynamic import DynamicScaling


@register("ntk", aliases=("ntk_aware",))
@dataclass(frozen=True)
class NTKConfig(PositionMethod):
    """Static NTK-aware: rope base raised to theta * s^(d/(d-2)) (native ``default``)."""

    paper = "bloc97 2023; YaRN paper arXiv:2309.00071 sec. 3.1"
    composes = True

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return {**base.rope_parameters, "rope_theta": ntk_theta(base.theta, self.factor, base.rotary_dim)}

    def pair_factors(self, base: BaseRope) -> torch.Tensor:
        return ntk_pair_factors(self.factor, base.rotary_dim)


@register("dynamic_ntk", aliases=("dynamic",))
@dataclass(frozen=True)
class DynamicNTKConfig(DynamicScaling):
    """Dynamic NTK: NTK base recomputed from the current length (native ``dynamic``)."""

    paper = "emozilla 2023; YaRN paper arXiv:2309.00071 sec. 3.3"

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return {**base.rope_parameters, "rope_type": "dynamic", "factor": self.factor}
