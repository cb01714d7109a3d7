"""Self-Extend (``self_extend``, Jin et al. 2024): grouped positions past a local window; docs/methods/training_free.md.

:mod:`.config` holds the config, :mod:`.remap` the positions as attention pieces; the attention and
surgery are shared with DCA (:mod:`hf_posext.attention.remap`, :mod:`..remap_surgery`).
"""

from ..registry import register_method
from ..remap_surgery import REMAP_ATTENTIONS, RemapSurgery
from ..remapping import REMAP_ROPE_TYPES
from .config import SelfExtendConfig
from .remap import SelfExtendRemapping

register_method(
    "self_extend", SelfExtendConfig, surgery=RemapSurgery, rope_types=REMAP_ROPE_TYPES, attention=REMAP_ATTENTIONS
)

__all__ = ["SelfExtendConfig", "SelfExtendRemapping"]
