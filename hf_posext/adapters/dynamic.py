"""Adapter of the dynamic methods (``dynamic_ntk``, ``dynamic_yarn``): exact KV-cache scaling or transformers' own.

With ``exact_cache=True`` (the default) :mod:`hf_posext.exact_dynamic` keeps KV-cached decoding
equal to a forward pass at every step; ``False`` keeps transformers' behaviour with one fix:
when transformers resets the frequencies for a sequence shorter than the original context,
YaRN's attention scaling is reset with them (:func:`hf_posext._compat.restore_scaling_on_reset`).
"""

from __future__ import annotations

import torch.nn as nn

from .. import _compat
from ..exact_dynamic import disable_exact_dynamic_cache, enable_exact_dynamic_cache, exact_rotary_at_init
from ..methods.dynamic import DynamicScaling
from .base import Adapter, register_adapter


@register_adapter(DynamicScaling)
class DynamicAdapter(Adapter):
    def patch_modules(self, method: DynamicScaling, model: nn.Module) -> None:
        if method.exact_cache:
            enable_exact_dynamic_cache(model)
        else:  # the rotary modules were just rebuilt by patch_model, so each gets the hook once
            for _, rotary in _compat.rotary_modules(model):
                _compat.restore_scaling_on_reset(rotary)

    def unpatch_modules(self, method: DynamicScaling, model: nn.Module) -> None:
        disable_exact_dynamic_cache(model)

    def on_rotary_init(self, method: DynamicScaling, base_model: nn.Module, rotary: nn.Module) -> nn.Module | None:
        if not method.exact_cache:
            _compat.restore_scaling_on_reset(rotary)
            return None
        return exact_rotary_at_init(base_model, rotary)
