"""Attention over remapped positions: the kernel Self-Extend, DCA, STRING and ReRoPE share, and its install.

A method gives a `Remapping` (the pieces of each query block, a `Layout`);
`remap_attention` (`attention`) scores them by the fused CPU flash path
(`flash_segments`) or the score path; `install` puts it into a model and guards it;
`rope_type` is the rope type a remapped config carries. The maths is in
``docs/methods/training_free.md``; the methods' configs and surgery are `hf_posext.methods.remapping`.
"""

from .attention import (
    ATTENTION_PREFIX,
    BLOCK_ELEMENTS,
    SAVED_ATTENTION,
    STATE_ATTR,
    Remapping,
    RemapState,
    attention_scale,
    remap_attention,
    row_offsets,
    segmented_attention,
)
from .flash_segments import flash_available, flash_segmented_attention, flash_with_lse
from .install import FALLBACK, install_remap_guard, install_remapping, remove_remap_guard, uninstall_remapping
from .layout import Layout, PairLayout, Piece, Queries, SplitLayout, positioned_split, rotate_by
from .rope_type import (
    compute_remap_rope_parameters,
    remap_rope_parameters,
    shipped_parameters,
    validate_remap_rope_parameters,
)

__all__ = [
    "ATTENTION_PREFIX",
    "BLOCK_ELEMENTS",
    "FALLBACK",
    "SAVED_ATTENTION",
    "STATE_ATTR",
    "Layout",
    "PairLayout",
    "Piece",
    "Queries",
    "RemapState",
    "Remapping",
    "SplitLayout",
    "attention_scale",
    "compute_remap_rope_parameters",
    "flash_available",
    "flash_segmented_attention",
    "flash_with_lse",
    "install_remap_guard",
    "install_remapping",
    "positioned_split",
    "remap_attention",
    "remap_rope_parameters",
    "remove_remap_guard",
    "rotate_by",
    "row_offsets",
    "segmented_attention",
    "shipped_parameters",
    "uninstall_remapping",
    "validate_remap_rope_parameters",
]
