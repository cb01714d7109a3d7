"""Registers hf-posext's custom rope types with transformers (run once on ``import hf_posext``)."""

from __future__ import annotations

from typing import Any

from . import _compat
from .methods.yarn import DYNAMIC_YARN_ROPE_TYPE, DynamicYarnConfig, compute_dynamic_yarn_parameters

_VALIDATED_KEYS = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"}


def _validate_dynamic_yarn(rope_parameters: dict[str, Any]) -> None:
    missing = {"factor", "original_max_position_embeddings"} - set(rope_parameters)
    if missing:
        raise KeyError(f"rope_type {DYNAMIC_YARN_ROPE_TYPE!r} needs {sorted(missing)} in rope_parameters")
    DynamicYarnConfig(**{k: v for k, v in rope_parameters.items() if k in _VALIDATED_KEYS})


def register_all() -> None:
    _compat.register_rope_type(DYNAMIC_YARN_ROPE_TYPE, compute_dynamic_yarn_parameters, _validate_dynamic_yarn)
