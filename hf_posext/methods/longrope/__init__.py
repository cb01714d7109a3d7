"""LongRoPE (``longrope``): Ding et al. 2024, per-pair factors in transformers' native ``longrope``
(with ``keep_first``, hf-posext's own rope type); docs/methods/longrope.md."""

from ...rope_utils import LONGROPE_KEEP_FIRST_ROPE_TYPE
from ..proportional import PROPORTIONAL_ROPE_TYPES
from ..registry import MethodSpec, RopeType, register_family
from .config import LongRopeConfig, yarn_long_factors
from ...post_import import deprecated_attribute
from .pinned import pinned_factors
from .rope import LongRopeRotaryEmbedding, compute_keep_first_parameters, validate_keep_first_parameters
from .surgery import LongRopeSurgery
from .training import LongRopeTraining

register_family(
    "longrope",
    methods=[MethodSpec("longrope", LongRopeConfig, surgery=LongRopeSurgery, training=LongRopeTraining)],
    rope_types={
        LONGROPE_KEEP_FIRST_ROPE_TYPE: RopeType(compute_keep_first_parameters, validate_keep_first_parameters),
        **PROPORTIONAL_ROPE_TYPES,
    },
)

__all__ = ["LongRopeConfig", "LongRopeRotaryEmbedding", "LongRopeTraining", "pinned_factors", "yarn_long_factors"]


def __getattr__(name: str) -> object:
    return deprecated_attribute(__name__, name)
