"""What every dynamic method shares: the ``exact_cache`` option and its module hooks.

Dynamic methods (YaRN paper, arXiv 2309.00071, section 3.3) recompute the rotary frequencies
from the current sequence length. With ``exact_cache=True`` (the default)
:mod:`hf_posext.dynamic_cache` keeps KV-cached decoding equal to a forward pass at every step;
``False`` keeps transformers' behaviour, whose cache holds keys rotated with stale frequencies
(transformers issue 25104), with one fix: when transformers resets the frequencies for a sequence
shorter than the original context, YaRN's attention scaling is reset with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import _compat
from .base import PositionMethod

if TYPE_CHECKING:
    import torch.nn as nn


@dataclass(frozen=True)
class DynamicScaling(PositionMethod):
    """Base of the dynamic methods.

    Args:
        exact_cache: keep KV-cached decoding equal to a forward pass at every step
            (:mod:`hf_posext.dynamic_cache`); ``False`` rotates each key once before caching, as
            transformers does for its dynamic types and the YaRN repository for dynamic YaRN.
    """

    dynamic = True

    exact_cache: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.exact_cache, bool):
            raise ValueError(f"{self.name}: exact_cache must be True or False, got {self.exact_cache!r}")

    # dynamic_cache imports the methods, so it is imported lazily here.
    def patch_modules(self, model: nn.Module) -> None:
        if self.exact_cache:
            from ..dynamic_cache import enable_exact_dynamic_cache

            enable_exact_dynamic_cache(model)
        else:  # the rotary modules were just rebuilt by patch_model, so each gets the hook once
            for _, rotary in _compat.rotary_modules(model):
                _compat.restore_scaling_on_reset(rotary)

    def unpatch_modules(self, model: nn.Module) -> None:
        from ..dynamic_cache import disable_exact_dynamic_cache

        disable_exact_dynamic_cache(model)

    def on_rotary_init(self, base_model: nn.Module, rotary: nn.Module) -> nn.Module | None:
        # A saved exact_cache=True checkpoint reloads exact (from_pretrained after import hf_posext).
        if not self.exact_cache:
            _compat.restore_scaling_on_reset(rotary)
            return None
        from ..dynamic_cache import exact_rotary_at_init

        return exact_rotary_at_init(base_model, rotary)
