"""LongRoPE's surgery: the switch's cache (the default, `switch`), the exact dynamic cache
(``factors_by="query"``), or transformers' own cache with, for ``keep_first``, the rotary module of `rope`."""

from __future__ import annotations

import logging

import torch.nn as nn
from transformers import PreTrainedConfig

from ...attention.exact_dynamic import length_dependent
from ...rope_utils import kept_positions
from ..dynamic import DynamicSurgery
from . import switch
from .config import LongRopeConfig
from .rope import LongRopeRotaryEmbedding, unwrap_rotary_modules, wrap_rotary_modules

logger = logging.getLogger("hf_posext")


def _switches(method: LongRopeConfig, config: PreTrainedConfig) -> bool:
    """Whether the switch's cache applies: the default definition, exact, with factors that switch."""
    return method.exact_cache and method.factors_by == "sequence" and length_dependent(config.rope_parameters)


class LongRopeSurgery(DynamicSurgery):
    """[`DynamicSurgery`][hf_posext.DynamicSurgery] for ``factors_by="query"`` and for ``exact_cache=False``
    (with `rope.LongRopeRotaryEmbedding` around the rotary modules of a keep-first model); by default
    per-row rotary modules and the switch's recompute (`switch`)."""

    def check(self, method: LongRopeConfig, config: PreTrainedConfig, model: nn.Module | None) -> None:  # type: ignore[override]
        if method.factors_by == "query":
            super().check(method, config, model)

    def patch_modules(self, method: LongRopeConfig, model: nn.Module) -> None:  # type: ignore[override]
        if _switches(method, model.config):
            switch.enable(model)
            return
        if method.factors_by == "query" and length_dependent(model.config.rope_parameters):
            logger.warning(
                "longrope factors_by='query' is hf-posext's own definition: a checkpoint saved from this model is "
                "read by vanilla transformers, transformers 4.57, vLLM, SGLang and llama.cpp with the long factors "
                "at every position past L_orig=%d (factors_by='sequence'), other logits than these",
                int(model.config.rope_parameters["original_max_position_embeddings"]),
            )
        super().patch_modules(method, model)
        if not method.exact_cache and kept_positions(model.config.rope_parameters):
            wrap_rotary_modules(model)

    def unpatch_modules(self, method: LongRopeConfig, model: nn.Module) -> None:  # type: ignore[override]
        switch.disable(model)
        unwrap_rotary_modules(model)
        super().unpatch_modules(method, model)

    def on_rotary_init(  # type: ignore[override]
        self, method: LongRopeConfig, base_model: nn.Module, rotary: nn.Module
    ) -> nn.Module | None:
        if _switches(method, base_model.config):
            wrapper = LongRopeRotaryEmbedding(rotary, per_row=True)
            switch.install(base_model, (wrapper,))
            return wrapper
        replaced = super().on_rotary_init(method, base_model, rotary)
        if replaced is None and kept_positions(base_model.config.rope_parameters):
            return LongRopeRotaryEmbedding(rotary)
        return replaced

    def missing(self, method: LongRopeConfig, model: nn.Module) -> str | None:  # type: ignore[override]
        if _switches(method, model.config):
            return None if switch.enabled(model) else "the switch's cache (its prefix computed again past L_orig)"
        if method.factors_by == "query":
            return super().missing(method, model)
        wrapped = any(isinstance(m, LongRopeRotaryEmbedding) for m in model.modules())
        if not method.exact_cache and kept_positions(model.config.rope_parameters) and not wrapped:
            return "the keep_first rotary module (its first positions on plain RoPE)"
        return None
