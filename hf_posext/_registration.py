"""Registers hf-posext's custom rope types and attention with transformers (run once on ``import hf_posext``)."""

from __future__ import annotations

from typing import Any

from . import _compat
from .attention import register_attention
from .loading import set_construction_hook
from .methods.yarn import DynamicYarnConfig
from .rope_utils import (
    DYNAMIC_YARN_ROPE_TYPE,
    NO_ROPE_TYPE,
    compute_dynamic_yarn_parameters,
    compute_no_rope_parameters,
    validate_no_rope_parameters,
)
from .readers.transformers5 import RENAMED_ROPE_TYPES

_VALIDATED_KEYS = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"}


def _validate_dynamic_yarn(rope_parameters: dict[str, Any]) -> None:
    missing = {"factor", "original_max_position_embeddings"} - set(rope_parameters)
    if missing:
        raise KeyError(f"rope_type {DYNAMIC_YARN_ROPE_TYPE!r} needs {sorted(missing)} in rope_parameters")
    DynamicYarnConfig(**{k: v for k, v in rope_parameters.items() if k in _VALIDATED_KEYS})


def register_all() -> None:
    _compat.register_rope_type(DYNAMIC_YARN_ROPE_TYPE, compute_dynamic_yarn_parameters, _validate_dynamic_yarn)
    _compat.register_rope_type(NO_ROPE_TYPE, compute_no_rope_parameters, validate_no_rope_parameters)
    # Checkpoints saved before the rope types were renamed stay loadable (readers.transformers5).
    renamed = {DYNAMIC_YARN_ROPE_TYPE: (compute_dynamic_yarn_parameters, _validate_dynamic_yarn),
               NO_ROPE_TYPE: (compute_no_rope_parameters, validate_no_rope_parameters)}
    for old, new in RENAMED_ROPE_TYPES.items():
        _compat.register_rope_type(old, *renamed[new])
    register_attention()
    # Lets a model built from a saved patched config (from_pretrained) get back what the method
    # adds beyond rope parameters before its weights are loaded; acts only inside a model's
    # __init__ (see hf_posext.loading).
    set_construction_hook(True)
