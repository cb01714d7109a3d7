"""What the dynamic methods (``dynamic_ntk``, ``dynamic_yarn``, ``longrope``) share: ``exact_cache`` and its surgery.

Dynamic methods recompute the rotary frequencies from the current sequence length. With
``exact_cache=True`` (the default) `hf_posext.attention.exact_dynamic` keeps KV-cached decoding equal
to a forward pass at every step; ``False`` keeps transformers' behaviour (stale cached keys), with
YaRN's attention scaling reset along with the frequencies (docs/methods/dynamic.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
from transformers import PreTrainedConfig

from .. import integration
from ..architectures import check_wrappable_attention
from ..attention.exact_dynamic import (
    ExactDynamicRotaryEmbedding,
    disable_exact_dynamic_cache,
    enable_exact_dynamic_cache,
    exact_rotary_at_init,
    length_dependent,
)
from ..attention.exact_dynamic.install import FALLBACK, PURPOSE
from .base import MethodConfig
from .surgery import Surgery


@dataclass(frozen=True)
class ExactCacheOption(MethodConfig):
    """Base of the methods whose frequencies change with the length (the dynamic ones, ``longrope``'s switch).

    Args:
        exact_cache: keep KV-cached decoding equal to a forward pass at every step
            (`hf_posext.attention.exact_dynamic`); ``False`` rotates each key once before caching, as
            transformers does for its dynamic types and ``longrope``, and the YaRN repository for dynamic YaRN.
    """

    exact_cache: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.exact_cache, bool):
            raise ValueError(f"{self.name}: exact_cache must be True or False, got {self.exact_cache!r}")


@dataclass(frozen=True)
class DynamicScaling(ExactCacheOption):
    """Base of the dynamic methods (frequencies recomputed from the current length; ``exact_cache`` as above)."""

    dynamic = True


class DynamicSurgery(Surgery):
    """Exact KV-cache scaling (``exact_cache=True``) or transformers' own with the scaling reset fixed."""

    def check(self, method: ExactCacheOption, config: PreTrainedConfig, model: nn.Module | None) -> None:
        if method.exact_cache:
            check_wrappable_attention(config, model, purpose=PURPOSE, fallback=FALLBACK)

    def patch_modules(self, method: ExactCacheOption, model: nn.Module) -> None:
        if method.exact_cache:
            enable_exact_dynamic_cache(model)
        else:  # the rotary modules were just rebuilt by patch_model, so each gets the hook once
            for _, rotary in integration.rotary_modules(model):
                integration.restore_scaling_on_reset(rotary)

    def unpatch_modules(self, method: ExactCacheOption, model: nn.Module) -> None:
        disable_exact_dynamic_cache(model)

    def on_rotary_init(self, method: ExactCacheOption, base_model: nn.Module, rotary: nn.Module) -> nn.Module | None:
        if not method.exact_cache:
            integration.restore_scaling_on_reset(rotary)
            return None
        return exact_rotary_at_init(base_model, rotary)

    def missing(self, method: ExactCacheOption, model: nn.Module) -> str | None:
        if not method.exact_cache:
            return None
        stand_in = any(isinstance(m, ExactDynamicRotaryEmbedding) for m in model.modules())
        return "the exact KV-cache wrapper" if length_dependent(model.config.rope_parameters) and not stand_in else None
