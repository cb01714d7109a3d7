"""Absolute position encodings added to the input embeddings (``sinusoidal``, ``learned``); docs/methods/absolute.md."""

from ..norope import NO_ROPE_TYPES
from ..registry import MethodSpec, register_family
from .config import LearnedConfig, SinusoidalConfig
from .surgery import LearnedSurgery, SinusoidalSurgery

register_family(
    "absolute",
    methods=[
        MethodSpec("sinusoidal", SinusoidalConfig, surgery=SinusoidalSurgery),
        MethodSpec("learned", LearnedConfig, surgery=LearnedSurgery),
    ],
    rope_types=NO_ROPE_TYPES,
)

__all__ = ["LearnedConfig", "SinusoidalConfig"]
