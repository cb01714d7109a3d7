"""ReRoPE and leaky ReRoPE (``rerope``, Su 2023): distances capped at a window; docs/methods/training_free.md.

`config` holds the config, `remap` the positions as attention pieces; the attention and
surgery are shared with the other remapping methods (`hf_posext.attention.remap`, `remapping`).
"""

from ..registry import register_method
from ..remapping import REMAP_ATTENTIONS, REMAP_ROPE_TYPES, RemapSurgery
from .config import ReRopeConfig
from .remap import ReRopeRemapping

register_method("rerope", ReRopeConfig, surgery=RemapSurgery, rope_types=REMAP_ROPE_TYPES, attention=REMAP_ATTENTIONS)

__all__ = ["ReRopeConfig", "ReRopeRemapping"]
