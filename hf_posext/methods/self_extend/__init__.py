"""Self-Extend (``self_extend``, Jin et al. 2024): grouped positions past a local window; docs/methods/training_free.md.

`config` holds the config, `remap` the positions as attention pieces; the attention and
surgery are shared with DCA (`hf_posext.attention.remap`, `remapping`).
"""

from ..registry import register_method
from ..remapping import REMAP_ATTENTIONS, REMAP_ROPE_TYPES, RemapSurgery
from .config import SelfExtendConfig
from .remap import SelfExtendRemapping

register_method(
    "self_extend", SelfExtendConfig, surgery=RemapSurgery, rope_types=REMAP_ROPE_TYPES, attention=REMAP_ATTENTIONS
)

__all__ = ["SelfExtendConfig", "SelfExtendRemapping"]
