"""LongRoPE's surgery: the exact cache (as the dynamic methods), or with ``keep_first`` and
``exact_cache=False`` the per-position rotary module of :mod:`.rope`."""

from __future__ import annotations

import torch.nn as nn

from ...rope_utils import kept_positions
from ..dynamic import DynamicSurgery, ExactCacheOption
from .rope import KeepFirstRotaryEmbedding, unwrap_rotary_modules, wrap_rotary_modules


class LongRopeSurgery(DynamicSurgery):
    """:class:`~hf_posext.methods.dynamic.DynamicSurgery`, plus :class:`~.rope.KeepFirstRotaryEmbedding`
    around the rotary modules of a keep-first model without the exact cache."""

    def patch_modules(self, method: ExactCacheOption, model: nn.Module) -> None:
        super().patch_modules(method, model)
        if not method.exact_cache:
            wrap_rotary_modules(model)

    def unpatch_modules(self, method: ExactCacheOption, model: nn.Module) -> None:
        unwrap_rotary_modules(model)
        super().unpatch_modules(method, model)

    def on_rotary_init(self, method: ExactCacheOption, base_model: nn.Module, rotary: nn.Module) -> nn.Module | None:
        replaced = super().on_rotary_init(method, base_model, rotary)
        if replaced is None and kept_positions(base_model.config.rope_parameters):
            return KeepFirstRotaryEmbedding(rotary)
        return replaced

    def missing(self, method: ExactCacheOption, model: nn.Module) -> str | None:
        missing = super().missing(method, model)
        wrapped = any(isinstance(m, KeepFirstRotaryEmbedding) for m in model.modules())
        if missing is None and not method.exact_cache and kept_positions(model.config.rope_parameters) and not wrapped:
            return "the keep_first rotary module (its first positions on plain RoPE)"
        return missing
