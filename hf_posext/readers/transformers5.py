"""transformers 5 without ``import hf_posext``: rope types that name what is missing.

hf-posext's rope types read ``... (requires: import hf_posext)``; the families' ``RopeType.old_names`` keep
checkpoints with the older names loadable (docs/readers/index.md).
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
    """``("same", how)``: transformers 5 reads every hf-posext checkpoint, some only after the import."""
    if rope_type in custom_rope_types():
        return "same", f"after `import hf_posext`; without it, KeyError: {rope_type!r}"
    return "same", "native rope type: loads with or without hf-posext"
