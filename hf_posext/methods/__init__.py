"""Position-encoding methods: one module per family, each registered by name in :mod:`.base`."""

from . import absolute, alibi, dca, linear, ntk, self_extend, yarn  # noqa: F401  (importing a family registers its methods)
from .absolute import LearnedConfig, SinusoidalConfig
from .alibi import AlibiConfig
from .base import (
    BaseRope,
    PositionMethod,
    available_methods,
    canonical_name,
    make_method,
    method_aliases,
    method_class,
    register,
)
from .linear import LinearConfig
from .ntk import DynamicNTKConfig, NTKConfig
from .yarn import DynamicYarnConfig, YarnConfig

__all__ = [
    "AlibiConfig",
    "BaseRope",
    "DynamicNTKConfig",
    "DynamicYarnConfig",
    "LearnedConfig",
    "LinearConfig",
    "NTKConfig",
    "PositionMethod",
    "SinusoidalConfig",
    "YarnConfig",
    "available_methods",
    "canonical_name",
    "make_method",
    "method_aliases",
    "method_class",
    "register",
]
