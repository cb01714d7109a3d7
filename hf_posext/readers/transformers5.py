"""transformers 5 without ``import hf_posext``: rope types that name what is missing.

hf-posext's rope types read ``... (requires: import hf_posext)``; :data:`RENAMED_ROPE_TYPES` keeps
checkpoints with the older names loadable (docs/readers/index.md).
"""

from __future__ import annotations

from ..rope_utils import DYNAMIC_YARN_ROPE_TYPE, NO_ROPE_TYPE

#: Old rope type name -> current one.
RENAMED_ROPE_TYPES = {"hf_posext_dynamic_yarn": DYNAMIC_YARN_ROPE_TYPE, "hf_posext_none": NO_ROPE_TYPE}

#: hf-posext's own rope types: transformers 5 loads them only after ``import hf_posext``.
CUSTOM_ROPE_TYPES = (DYNAMIC_YARN_ROPE_TYPE, NO_ROPE_TYPE, *RENAMED_ROPE_TYPES)


def current_rope_type(rope_type: str) -> str:
    """``rope_type`` under its current name (old checkpoints carry the names before the rename)."""
    return RENAMED_ROPE_TYPES.get(rope_type, rope_type)


def verdict(rope_type: str) -> tuple[str, str]:
    """``("right", how)``: transformers 5 reads every hf-posext checkpoint, some only after the import."""
    if rope_type in CUSTOM_ROPE_TYPES:
        return "right", f"after `import hf_posext`; without it, KeyError: {rope_type!r}"
    return "right", "native rope type: loads with or without hf-posext"
