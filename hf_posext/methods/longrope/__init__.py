"""LongRoPE (``longrope``): Ding et al. 2024, per-pair factors in transformers' native ``longrope``; docs/methods/longrope.md."""

from ..dynamic import DynamicSurgery
from ..registry import MethodSpec, register_family
from .config import LongRopeConfig, yarn_long_factors

register_family("longrope", methods=[MethodSpec("longrope", LongRopeConfig, surgery=DynamicSurgery)])

__all__ = ["LongRopeConfig", "yarn_long_factors"]
