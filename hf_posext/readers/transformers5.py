"""transformers 5 without ``import hf_posext``: rope types that name what is missing.

hf-posext's rope types read ``... (requires: import hf_posext)``; the families' ``RopeType.old_names`` keep
checkpoints with the older names loadable (docs/readers/index.md).
"""

from __future__ import annotations

from ..methods.registry import rope_types
from ..validation.unknown_method import is_native_rope_type


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
    """``(status, how)``: transformers 5 reads hf-posext's own rope types after ``import hf_posext`` and its native
    ones always; a plugin's rope type, or one nobody registered, it refuses (a plugin's: unless it is imported)."""
    current = current_rope_type(rope_type)
    if current in rope_types() and not rope_types()[current].init.__module__.startswith("hf_posext."):
        return "refused", f"KeyError: {rope_type!r} unless the plugin that registers it is imported first"
    if rope_type in custom_rope_types():
        return "same", f"after `import hf_posext`; without it, KeyError: {rope_type!r}"
    if not is_native_rope_type(rope_type):
        return "refused", f"KeyError: {rope_type!r}: no rope type of that name is registered in this process"
    return "same", "native rope type: loads with or without hf-posext"
