"""transformers 5 without ``import hf_posext``: rope types that name what is missing.

transformers 5 looks a rope type up in ``ROPE_INIT_FUNCTIONS`` inside each model's rotary
``__init__`` (``modeling_llama.LlamaRotaryEmbedding``, 5.24), so a type it does not know stops
``from_pretrained`` with ``KeyError: '<rope type>'``; config validation only logs a warning for
it. Nothing of hf-posext runs before that (no import, no remote code), so the one text such a
user sees is the type's name: hf-posext's types therefore read ``... (requires: import hf_posext)``.
vLLM and SGLang print the same name in their "Unknown RoPE scaling type" errors, transformers
4.57 in its KeyError, llama.cpp's converter in its "Unknown RoPE type" warning.

Checkpoints written before the rename carry the bare names; the families register them too
(``RopeType.old_names``), and :func:`current_rope_type` upgrades them when a model is built.
"""

from __future__ import annotations

from ..methods.registry import rope_types


def renamed_rope_types() -> dict[str, str]:
    """Old rope type name -> current one, for every rope type a method family registered."""
    return {old: name for name, entry in rope_types().items() for old in entry.old_names}


def custom_rope_types() -> tuple[str, ...]:
    """hf-posext's own rope types (old names included): transformers 5 loads them only after ``import hf_posext``."""
    return (*rope_types(), *renamed_rope_types())


def current_rope_type(rope_type: str) -> str:
    """``rope_type`` under its current name (old checkpoints carry the names before the rename)."""
    return renamed_rope_types().get(rope_type, rope_type)


def verdict(rope_type: str) -> tuple[str, str]:
    """``("right", how)``: transformers 5 reads every hf-posext checkpoint, some only after the import."""
    if rope_type in custom_rope_types():
        return "right", f"after `import hf_posext`; without it, KeyError: {rope_type!r}"
    return "right", "native rope type: loads with or without hf-posext"
