"""Registers hf-posext's custom rope types and attention with transformers (run once on ``import hf_posext``)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from . import _compat
from .attention import register_attention
from .methods.alibi import NO_ROPE_TYPE, compute_no_rope_parameters, validate_no_rope_parameters
from .methods.yarn import DYNAMIC_YARN_ROPE_TYPE, DynamicYarnConfig, compute_dynamic_yarn_parameters
from .patching import on_submodule_registered

_model_init_hook = None

_VALIDATED_KEYS = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"}


def _validate_dynamic_yarn(rope_parameters: dict[str, Any]) -> None:
    missing = {"factor", "original_max_position_embeddings"} - set(rope_parameters)
    if missing:
        raise KeyError(f"rope_type {DYNAMIC_YARN_ROPE_TYPE!r} needs {sorted(missing)} in rope_parameters")
    DynamicYarnConfig(**{k: v for k, v in rope_parameters.items() if k in _VALIDATED_KEYS})


def register_all() -> None:
    _compat.register_rope_type(DYNAMIC_YARN_ROPE_TYPE, compute_dynamic_yarn_parameters, _validate_dynamic_yarn)
    _compat.register_rope_type(NO_ROPE_TYPE, compute_no_rope_parameters, validate_no_rope_parameters)
    register_attention()
    global _model_init_hook
    if _model_init_hook is None:
        # Lets a model built from a saved patched config (from_pretrained) get back what the
        # method adds beyond rope parameters - ALiBi's attention, absolute encodings' position
        # table, dynamic methods' exact KV-cache wrapper - before the weights are loaded; see
        # patching.on_submodule_registered.
        _model_init_hook = nn.modules.module.register_module_module_registration_hook(on_submodule_registered)
