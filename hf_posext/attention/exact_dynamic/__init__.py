"""Dynamic NTK and dynamic YaRN that stay exact with a KV cache (``exact_cache=True``).

Keys are cached before RoPE (`install`) and an attention wrapper (`attention`) rotates
them for each query's length, with a per-forward plan. Definition, design, costs and limits:
docs/guides/exact_dynamic.md.
"""

from .attention import exact_dynamic_attention
from .install import (
    SUPPORTED_KERNELS,
    ExactDynamicRotaryEmbedding,
    disable_exact_dynamic_cache,
    enable_exact_dynamic_cache,
    exact_rotary_at_init,
)
from .forward_plan import ATTENTION_PREFIX, ExactDynamicRope, ForwardPlan
from .frequencies import EXACT_ROPE_TYPES, length_dependent
from .rotation import apply_rotary, cos_sin, grid_rotations

__all__ = [
    "ATTENTION_PREFIX",
    "EXACT_ROPE_TYPES",
    "SUPPORTED_KERNELS",
    "ExactDynamicRope",
    "ExactDynamicRotaryEmbedding",
    "ForwardPlan",
    "apply_rotary",
    "cos_sin",
    "disable_exact_dynamic_cache",
    "enable_exact_dynamic_cache",
    "exact_dynamic_attention",
    "exact_rotary_at_init",
    "grid_rotations",
    "length_dependent",
]
