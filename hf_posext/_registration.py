"""Registers hf-posext's custom rope types and attention with transformers (run once on ``import hf_posext``)."""

from __future__ import annotations

from typing import Any

from . import _compat
from .attention import register_attention
from .base_rope import CONFIG_KEY
from .loading import set_construction_hook
from .methods.yarn import DynamicYarnConfig
from .rope_utils import (
    DYNAMIC_YARN_ROPE_TYPE,
    NO_ROPE_TYPE,
    compute_dynamic_yarn_parameters,
    compute_no_rope_parameters,
)
from .readers.transformers5 import RENAMED_ROPE_TYPES

_VALIDATED_KEYS = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"}
#: What a dynamic YaRN entry must have and may have (a composed one carries the checkpoint's own scaling).
_DYNAMIC_YARN_REQUIRED = {"rope_type", "factor", "original_max_position_embeddings"}
_DYNAMIC_YARN_OPTIONAL = {"rope_theta", "beta_fast", "beta_slow", "attention_factor", "truncate", "base_factors",
                          "base_attention_factor"}


def _validate_dynamic_yarn(config: Any, rope_parameters: dict[str, Any], ignore_keys: set[str] | None) -> None:
    _compat.check_received_keys(config, rope_parameters, _DYNAMIC_YARN_REQUIRED, _DYNAMIC_YARN_OPTIONAL, ignore_keys)
    DynamicYarnConfig(**{k: v for k, v in rope_parameters.items() if k in _VALIDATED_KEYS})


def _validate_no_rope(config: Any, rope_parameters: dict[str, Any], ignore_keys: set[str] | None) -> None:
    """No rotary embedding: only ever written by a method that replaces RoPE, which its config's record names.

    Its own parameters are ``rope_theta`` (kept for unpatch); what it needs is that record
    (``config.hf_posext``): an entry of this type without it is missing the method that gives the
    model its positions, and is refused like any entry missing a required key.
    """
    _compat.check_received_keys(config, rope_parameters, {"rope_type"}, {"rope_theta"}, ignore_keys)
    record = getattr(config, CONFIG_KEY, None)
    if not isinstance(record, dict) or not record.get("method"):
        raise KeyError(
            f"rope_type {rope_parameters.get('rope_type')!r} switches rotary embeddings off for a method that replaces "
            f"them, and needs the config's {CONFIG_KEY!r} record naming that method (written by hf_posext.patch_model); "
            "this config has none"
        )


def register_all() -> None:
    _compat.register_rope_type(DYNAMIC_YARN_ROPE_TYPE, compute_dynamic_yarn_parameters, _validate_dynamic_yarn)
    _compat.register_rope_type(NO_ROPE_TYPE, compute_no_rope_parameters, _validate_no_rope)
    # Checkpoints saved before the rope types were renamed stay loadable (readers.transformers5).
    renamed = {DYNAMIC_YARN_ROPE_TYPE: (compute_dynamic_yarn_parameters, _validate_dynamic_yarn),
               NO_ROPE_TYPE: (compute_no_rope_parameters, _validate_no_rope)}
    for old, new in RENAMED_ROPE_TYPES.items():
        _compat.register_rope_type(old, *renamed[new])
    register_attention()
    # Lets a model built from a saved patched config (from_pretrained) get back what the method
    # adds beyond rope parameters before its weights are loaded; acts only inside a model's
    # __init__ (see hf_posext.loading).
    set_construction_hook(True)
