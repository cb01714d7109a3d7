"""Dual Chunk Attention (``dca``, An et al. 2024): chunked positions; docs/methods/training_free.md.

`config` holds the config and the load-time hook that adopts Qwen's ``dual_chunk_attention_config``,
`remap` the positions as attention pieces; the attention and surgery are shared with Self-Extend.
"""

from ..registry import register_method
from ..remapping import REMAP_ATTENTIONS, REMAP_ROPE_TYPES, RemapSurgery
from .config import DualChunkConfig, shipped_dual_chunk_config
from .remap import DualChunkRemapping

register_method(
    "dca",
    DualChunkConfig,
    surgery=RemapSurgery,
    rope_types=REMAP_ROPE_TYPES,
    attention=REMAP_ATTENTIONS,
    shipped_config=shipped_dual_chunk_config,
)

__all__ = ["DualChunkConfig", "DualChunkRemapping"]
