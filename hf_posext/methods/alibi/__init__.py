"""ALiBi (``alibi``): rotary off, a per-head linear bias in a registered attention; docs/methods/alibi.md.

`config` holds the config, `attention` the attention and mask functions (with
`folded` and `slopes`), `surgery` what a patch and a load do to the model.
"""

from ..norope import NO_ROPE_TYPES
from ..registry import AttentionFunctions, register_method
from .attention import (
    ALIBI_ATTENTION,
    BACKENDS,
    OLD_ALIBI_ATTENTION,
    alibi_attention_forward,
    alibi_mask,
    select_backend,
)
from .config import AlibiConfig
from .slopes import alibi_slopes
from .surgery import AlibiSurgery

register_method(
    "alibi",
    AlibiConfig,
    surgery=AlibiSurgery,
    rope_types=NO_ROPE_TYPES,
    # the old name too, so that older checkpoints load (the surgery then switches to the current name)
    attention={
        name: AttentionFunctions(alibi_attention_forward, alibi_mask) for name in (ALIBI_ATTENTION, OLD_ALIBI_ATTENTION)
    },
)

__all__ = ["ALIBI_ATTENTION", "BACKENDS", "AlibiConfig", "alibi_slopes", "select_backend"]
