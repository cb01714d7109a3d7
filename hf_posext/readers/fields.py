"""What hf-posext writes into a patched config for the readers that need more than ``rope_parameters``.

transformers 4.x and the engines read the legacy fields (`transformers4.legacy_fields`):
`write_reader_fields` puts them in, `clear_reader_fields` takes them out at unpatch, and
`restore_on_load` writes them again after transformers 5 has consumed them. docs/readers/index.md.
"""

from __future__ import annotations

from typing import Any

from .. import integration
from . import transformers4, transformers5


def _nested_entries(config: Any) -> list[str]:
    params = config.rope_parameters or {}
    return list(config.nested_rope_parameter_keys(params)) if hasattr(config, "nested_rope_parameter_keys") else []


def write_reader_fields(config: Any) -> None:
    """Put the 4.x fields (`transformers4.legacy_fields`) into ``config``, for ``save_pretrained`` to write.

    Per-layer-type rope parameters have no single 4.x equivalent: Gemma 3's get the fields 4.57's Gemma 3 reads
    (`transformers4.gemma3_fields`: ``rope_theta`` and ``rope_scaling`` for the full-attention layers,
    ``rope_local_base_freq`` for the sliding ones) where they express them; nothing is written for the others.
    """
    if _nested_entries(config):
        fields = None
        if getattr(config, "model_type", None) in transformers4.GEMMA3:
            fields = transformers4.gemma3_fields(config.rope_parameters)
        for name, value in (fields or {}).items():
            integration.set_saved_attribute(config, name, value)
        return
    for name, value in transformers4.legacy_fields(config.rope_parameters).items():
        integration.set_saved_attribute(config, name, value)


def saved_fields(config: Any) -> dict[str, Any]:
    """The fields `write_reader_fields` would overwrite, as ``config`` holds them now."""
    return {name: config.__dict__[name] for name in transformers4.LEGACY_FIELDS if name in config.__dict__}


def clear_reader_fields(config: Any, saved: dict[str, Any]) -> None:
    """Undo `write_reader_fields` (unpatch): put back ``saved`` (`saved_fields`), remove the rest."""
    for name in transformers4.LEGACY_FIELDS:
        integration.set_saved_attribute(config, name, None)
        if name in saved:  # an explicit None included: the config's own __dict__ comes back as it was
            config.__dict__[name] = saved[name]


def restore_on_load(config: Any) -> None:
    """For a patched config transformers 5 has just loaded: current rope type names, legacy fields again.

    transformers 5 consumes the legacy fields when it loads config.json; writing them again keeps
    them in a checkpoint saved from the loaded model.
    """
    rope = config.rope_parameters
    for entry in [rope[key] for key in _nested_entries(config)] or [rope]:
        entry["rope_type"] = transformers5.current_rope_type(entry.get("rope_type", "default"))
    write_reader_fields(config)


__all__ = ["clear_reader_fields", "restore_on_load", "saved_fields", "write_reader_fields"]
